"""A user's Ray Train function (`--entry module:function`) as a first-class run.

The function is written as Ray Train's docs teach: it reads its settings with `config.get(..., default)`,
calls `ray.train.report(metrics, checkpoint=...)` and, on a restart, `ray.train.get_checkpoint()`. For the
length of the function this worker taps those two calls (and only in this process):
- every report becomes a row of the run (rank 0's, to the driver's sink: metrics.parquet, loss.png, the
  progress bar, RunResult), moves this rank's heartbeat (the hang watchdog counts reports as progress), and
  a reported `loss` that is nan/inf ends the run with the loop's own NonFiniteLoss;
- a reported checkpoint folder gets the loop's manifest (each file's size and sha256, written by rank 0
  before Ray copies the folder into the run), so a copy cut short is found;
- `get_checkpoint` hands back the newest checkpoint that passes its manifest, from Ray's latest, the run
  folder (one written just before a worker died) or, for a `--resume`, the run's own.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ray.train

from orchestrator.raytrain.job import Job, resolve_entry, takes_config
from orchestrator.raytrain.reports import ReportRows
from orchestrator.raytrain.watchdog import Heartbeat
from trainables.checkpoint import MANIFEST_FILE, newest_complete, write_manifest
from trainables.context import DistContext

log = logging.getLogger("orchestrator.worker")
COUNT_FILE = "orchestrator_reports.json"  # in each reported checkpoint: how many reports came before it


class ReportTap:
    """What this worker adds around the function's `ray.train.report` and `ray.train.get_checkpoint`."""

    def __init__(self, job: Job, ctx: DistContext, sink: Any, beat: Heartbeat | None) -> None:
        self.job, self.ctx, self.sink, self.beat = job, ctx, sink, beat
        self.rows = ReportRows()
        self.real_report = ray.train.report
        self.real_get_checkpoint = ray.train.get_checkpoint

    def report(self, metrics: dict[str, Any], checkpoint: ray.train.Checkpoint | None = None, **kwargs: Any) -> None:
        row = self.rows.row(metrics)  # (a nan loss raises here, before its checkpoint is kept)
        if checkpoint is not None and self.ctx.is_main and Path(checkpoint.path).is_dir():
            folder = Path(checkpoint.path)
            (folder / COUNT_FILE).write_text(json.dumps({"reports": self.rows.reports}))
            write_manifest(folder, [str(p.relative_to(folder)) for p in sorted(folder.rglob("*"))
                                    if p.is_file() and p.name != MANIFEST_FILE])
        if self.beat is not None:
            self.beat.tick_step(int(row["step"]))
        if self.ctx.is_main and self.sink is not None:
            self.sink.push.remote(row)
        self.real_report(metrics, checkpoint=checkpoint, **kwargs)

    def get_checkpoint(self) -> ray.train.Checkpoint | None:
        latest = self.real_get_checkpoint()
        if self.job.remote:  # on a URI: Ray's own, read through its filesystem (as_directory)
            return latest
        found = newest_complete(self.job.checkpoint_folders(Path(latest.path) if latest else None))
        if found is not None:
            log.info("resuming from %s", found)
            count = found / COUNT_FILE  # the reports go on counting from the checkpoint's
            if count.exists():
                self.rows.reports = json.loads(count.read_text())["reports"]
        return ray.train.Checkpoint.from_directory(str(found)) if found else None

    @contextlib.contextmanager
    def installed(self) -> Iterator[ReportTap]:
        """`ray.train.report` and `ray.train.get_checkpoint` are this tap's while the function runs."""
        ray.train.report, ray.train.get_checkpoint = self.report, self.get_checkpoint
        try:
            yield self
        finally:
            ray.train.report, ray.train.get_checkpoint = self.real_report, self.real_get_checkpoint


def run_function(job: Job, ctx: DistContext, sink: Any, beat: Heartbeat | None) -> None:
    """Call the user's function the way TorchTrainer would, with its reports tapped. Its module is imported
    inside the tap, so a `from ray.train import report` there gets the tapped one."""
    with ReportTap(job, ctx, sink, beat).installed():
        fn = resolve_entry(job.entry or "")
        fn(job.user_config()) if takes_config(fn) else fn()
