"""A launch on a worker group of its own: one TorchTrainer for this run, a MetricsSink actor carrying rows and
heartbeats to this driver, the progress bar and the hang watchdog polling it."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
from ray.train import TrainingFailedError

from cluster.plan import Plan
from groundwork.errors import Interrupted, RunFailed
from orchestrator.config import LaunchConfig
from orchestrator.launcher.progress import LiveRows, progress_bar
from orchestrator.launcher.tail import LogTail
from orchestrator.launcher.tensorboard import TensorBoardRows
from orchestrator.raytrain.job import Job, WorkerArgs
from orchestrator.raytrain.sink import MetricsSink
from orchestrator.raytrain.trainer import failure_line, make_trainer
from orchestrator.raytrain.watchdog import Watchdog
from orchestrator.raytrain.worker import train_worker

log = logging.getLogger(__name__)
RemoteSink = ray.remote(num_cpus=0)(MetricsSink)


def sink_name(run: str) -> str:
    """The run's sink is named, so that tools (and tests) can read its heartbeats."""
    return f"orchestrator-sink-{run}"


def both(*calls: Callable[[list[dict]], None] | None) -> Callable[[list[dict]], None]:
    """Rows to each of several consumers (the bar, TensorBoard)."""
    def call(rows: list[dict]) -> None:
        for consumer in calls:
            if consumer is not None:
                consumer(rows)
    return call


def terminal(cfg: LaunchConfig, job: Job, run_dir: Path) -> tuple[Any, Callable[[list[dict]], None] | None]:
    """What the terminal shows while the job runs, and what takes its rows: the bar (the loop's epochs, or a
    function's reports); a script's own lines (from rank 0's log; with --verbose Ray forwards them); nothing
    with --quiet."""
    if cfg.quiet or (job.kind == "script" and cfg.verbose):
        return contextlib.nullcontext(), None
    if job.kind == "script":
        return LogTail(run_dir / "logs", every_rank=cfg.tee), None
    return progress_bar(None if job.kind == "function" else cfg.train.epochs)


def fit_own_group(cfg: LaunchConfig, the_plan: Plan, job: Job,
                  run_dir: Path) -> tuple[list[dict[str, float]], Path | None]:
    """Run the job on a new worker group; returns its rows and its latest checkpoint."""
    sink = RemoteSink.options(name=sink_name(run_dir.name)).remote()
    # A script's workers only coordinate over their own process group (gloo); the script makes its own.
    trainer = make_trainer(train_worker, WorkerArgs(job, sink), the_plan, run_dir,
                           keep_checkpoints=cfg.keep_checkpoints, max_failures=cfg.max_failures,
                           datasets=cfg.datasets, backend="gloo" if job.kind == "script" else None)
    bar, update = terminal(cfg, job, run_dir)
    board = TensorBoardRows(run_dir / "tb")
    watchdog = Watchdog(sink, cfg.hang_timeout, run_dir / "hang")
    try:
        with bar, LiveRows(sink, both(update, board)) as live, watchdog:
            try:
                result = trainer.fit()
            except TrainingFailedError as exc:
                raise RunFailed(failure_line(exc, watchdog.hangs, run_dir), live.rows) from exc
            except KeyboardInterrupt:  # Ctrl-C: the trainer has ended every rank (see LeanTrainer)
                raise Interrupted(live.rows, run_dir.name) from None
    finally:
        board.close()
        ray.kill(sink)  # now, not when Ray collects the handle: a --resume in this process reuses its name
    for hang in watchdog.hangs:  # hangs the run survived by restarting (--max-failures)
        log.warning("restarted after a hang: %s", hang)
    return live.rows, Path(result.checkpoint.path) if result.checkpoint else None
