"""A launch on a worker group of its own: one TorchTrainer for this run, a MetricsSink actor carrying rows and
heartbeats to this driver, the progress bar and the hang watchdog polling it."""

from __future__ import annotations

import contextlib
import logging
import shutil
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
from orchestrator.launcher.trackers import both, trackers
from orchestrator.raytrain.entry import train_worker
from orchestrator.raytrain.job import Job, WorkerArgs
from orchestrator.raytrain.session import on_this_node
from orchestrator.raytrain.sink import MetricsSink
from orchestrator.raytrain.trainer import failure_line, make_trainer
from orchestrator.raytrain.watchdog import Watchdog

log = logging.getLogger(__name__)
RemoteSink = ray.remote(num_cpus=0)(MetricsSink)


def sink_name(run: str) -> str:
    """The run's sink is named, so that tools (and tests) can read its heartbeats."""
    return f"orchestrator-sink-{run}"


def terminal(cfg: LaunchConfig, job: Job, run_dir: Path) -> tuple[Any, Callable[[list[dict]], None] | None]:
    """What the terminal shows while the job runs, and what takes its rows: the bar (the loop's epochs, or a
    function's reports); a script's own lines (from rank 0's log; with --verbose Ray forwards them); nothing
    with --quiet."""
    if cfg.quiet or (job.kind == "script" and cfg.verbose):
        return contextlib.nullcontext(), None
    if job.kind == "script":
        return LogTail(run_dir / "logs", every_rank=cfg.tee), None
    return progress_bar(None if job.kind == "function" else cfg.train.epochs)


def collect_nsight_reports(folder: Path) -> None:
    """Nsight Systems reports Ray wrote for this session's workers on this node, into the run's profile/
    (a report written on another node stays in that node's session logs, logs/nsight/)."""
    session = Path(ray._private.worker.global_worker.node.get_session_dir_path())  # Ray 2.60
    reports = sorted((session / "logs" / "nsight").glob("*.nsys-rep"))
    folder.mkdir(parents=True, exist_ok=True)
    for report in reports:
        shutil.copy2(report, folder / report.name)
    log.warning("%d Nsight Systems report(s) in %s", len(reports), folder)


def restarts_allowed(cfg: LaunchConfig) -> int:
    """--max-failures, and for an elastic run one more restart for each worker it may lose (a lost node is
    what elasticity is for, not a failure of the run)."""
    return cfg.max_failures + (cfg.workers - cfg.min_workers if cfg.min_workers else 0)


def fit_own_group(cfg: LaunchConfig, the_plan: Plan, job: Job,
                  run_dir: Path) -> tuple[list[dict[str, float]], Path | None]:
    """Run the job on a new worker group; returns its rows and its latest checkpoint."""
    sink = RemoteSink.options(name=sink_name(run_dir.name), scheduling_strategy=on_this_node()).remote()
    # A script's workers only coordinate over their own process group (gloo); the script makes its own.
    trainer = make_trainer(train_worker, WorkerArgs(job, sink), the_plan, run_dir,
                           keep_checkpoints=cfg.keep_checkpoints, max_failures=restarts_allowed(cfg),
                           datasets=cfg.datasets, backend="gloo" if job.kind == "script" else None,
                           nsight=cfg.nsys, min_workers=cfg.min_workers, remote=job.remote,
                           sigterm_notice=job.kind == "loop" and bool(cfg.train.checkpoints),  # else Ray's SIGTERM
                           controller_in_driver=job.controller_in_driver)
    bar, update = terminal(cfg, job, run_dir)
    watchdog = Watchdog(sink, cfg.hang_timeout, run_dir / "hang")
    failed: TrainingFailedError | None = None
    interrupted = False
    try:
        with trackers(cfg, run_dir) as track, bar, LiveRows(sink, both(update, track)) as live, watchdog:
            try:
                result = trainer.fit()
            except TrainingFailedError as exc:
                failed = exc
            except KeyboardInterrupt:  # Ctrl-C: the trainer has ended every rank (see LeanTrainer)
                interrupted = True
    finally:
        ray.kill(sink)  # now, not when Ray collects the handle: a --resume in this process reuses its name
    # Raised once LiveRows has taken the last rows (on leaving its block): a failure noticed quickly must
    # not lose the rows its ranks pushed just before.
    if failed is not None:
        raise RunFailed(failure_line(failed, watchdog.hangs, run_dir), live.rows) from failed
    if interrupted:
        raise Interrupted(live.rows, run_dir.name) from None
    if cfg.nsys:
        collect_nsight_reports(run_dir / "profile")
    for hang in watchdog.hangs:  # hangs the run survived by restarting (--max-failures)
        log.warning("restarted after a hang: %s", hang)
    return live.rows, Path(result.checkpoint.path) if result.checkpoint else None
