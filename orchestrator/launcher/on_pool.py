"""A launch on a pool (orchestrator.warm.pool): the job goes to the pool's warm group; its rows feed the
progress bar and metrics.parquet, and each checkpoint it reports moves into the run folder, as Ray Train would
have kept it."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

from groundwork.errors import RunFailed
from orchestrator.config import LaunchConfig
from orchestrator.launcher.progress import progress_bar
from orchestrator.launcher.trackers import both, trackers
from orchestrator.raytrain.job import Job
from orchestrator.warm.pool import submit
from trainables.checkpoint import checkpoints_in

log = logging.getLogger(__name__)


def keep_checkpoint(path: Path, run_dir: Path, keep: int) -> Path:
    """Move a reported checkpoint into the run folder under a Ray-style name (they sort by time), keep the
    newest `keep`."""
    dest = run_dir / f"checkpoint_{datetime.now().strftime('%Y-%m-%d_%H-%M-%S.%f')}"
    os.replace(path, dest)  # the staging folder is inside the run folder: one rename, complete or absent
    for old in checkpoints_in(run_dir)[keep:]:
        shutil.rmtree(old, ignore_errors=True)
    return dest


def run_on_pool(cfg: LaunchConfig, job: Job, run_dir: Path) -> tuple[list[dict[str, float]], Path | None]:
    """Run the launch's job on the pool; returns its rows and its latest checkpoint."""
    rows: list[dict[str, float]] = []
    bar, update = progress_bar(cfg.train.epochs) if not cfg.quiet else (contextlib.nullcontext(), None)

    def on_report(metrics: dict[str, Any], path: str | None) -> None:
        if path:
            keep_checkpoint(Path(path), run_dir, cfg.keep_checkpoints)

    log.info("run %s on the warm pool", run_dir.name)
    with trackers(cfg, run_dir) as track, bar:
        consumers = both(update, track)

        def on_row(row: dict[str, float]) -> None:
            rows.append(row)
            consumers(rows)

        try:
            submit(job, on_report, on_row)
        except RunFailed as exc:
            raise RunFailed(f"{exc} (logs: {run_dir / 'logs'})") from None
    latest = checkpoints_in(run_dir)
    return rows, latest[0] if latest else None
