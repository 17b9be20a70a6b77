"""Warm worker groups ("gangs") that run a sweep's trials one after another.

A fresh Ray Train run per trial costs ~20 s on a small machine before its first step: a controller and the
workers, each a new Python importing torch, then the process group. For a digits trial that trains for two
seconds, such a sweep is all startup (step fraction 0.02). So when every trial has the same shape (the search
space changes only training settings), the sweep starts one TorchTrainer per trial it can run at once, and
its workers stay up and run trial after trial of the shared loop on the process group they already have.

Tune still searches, schedules (ASHA, PBT) and records: a trial is a light function (`trial_on_gang`) that
claims a gang's Desk, hands it the trial's settings and checkpoint, and passes each report (with its
checkpoint) to Tune; Tune's answer (continue, or stop) goes back to the gang before it trains on. Only rank 0
talks to the desk; the other ranks learn each answer from it by broadcast.
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ray

from orchestrator.config import LaunchConfig
from orchestrator.periodic import Periodic
from orchestrator.sweeps.desk import GANG_FAILED, GO, Desk

log = logging.getLogger("orchestrator.gangs")
POLL_S = 1.0  # how long one desk call waits; the other ranks wait in one broadcast no longer than this


class TrialStopped(Exception):
    """Tune stopped (or paused) the trial this gang was running: leave the loop, take the next job."""


class JobFailed(RuntimeError):
    """The gang ended the job with an error (the job's own, or its worker group's)."""


def agree(is_main: bool, distributed: bool, device: Any, ask: Callable[[], Any]) -> Any:
    """Rank 0 asks the desk and every rank gets the answer, repeated while it is None (nothing yet), so that
    no rank waits in a single collective for longer than one poll."""
    import torch.distributed as dist

    while True:
        box = [ask() if is_main else None]
        if distributed:
            dist.broadcast_object_list(box, src=0, device=device)
        if box[0] is not None:
            return box[0]


class GangReporter:
    """The loop's reporter inside a gang: each checkpoint goes (via the desk) to Tune, and the loop goes on
    only if Tune lets the trial continue. Rows between checkpoints are not kept (Tune records the reports)."""

    def __init__(self, desk: Any, job: dict[str, Any], ctx: Any) -> None:
        self.desk = desk
        self.job = job
        self.ctx = ctx
        self.staging = Path(job["staging"])

    def log(self, row: dict[str, float]) -> None:
        if self.job.get("rows"):  # a launch shows and keeps every row; a sweep trial's reports are enough
            self.desk.row.remote(self.job["seq"], row)

    def progress(self, step: int) -> None:
        pass

    def checkpoint(self, metrics: dict[str, float], folder: str | None) -> None:
        ask, path = None, None
        if self.ctx.is_main:
            from trainables.checkpoint import copy_checkpoint

            # Where the trial can read it (the loop deletes `folder` when this returns).
            path = str(copy_checkpoint(folder, self.staging / Path(folder).name)) if folder else None
            index = ray.get(self.desk.report.remote(self.job["seq"], metrics, path))
            ask = lambda: ray.get(self.desk.verdict.remote(self.job["seq"], index, POLL_S))  # noqa: E731
        if agree(self.ctx.is_main, self.ctx.distributed, self.ctx.device, ask) != GO:
            if self.ctx.is_main and path:
                shutil.rmtree(path, ignore_errors=True)  # Tune will not take it
            raise TrialStopped


def run_job(job: dict[str, Any], ctx: Any, desk: Any) -> tuple[str, str]:
    """Run one trial's loop on this gang; returns how it ended ("done", "stopped", "error") and why."""
    from trainables.checkpoint import resume_state
    from trainables.config import TrainConfig
    from trainables.health import NonFiniteLoss
    from trainables.run import run_training

    cfg = TrainConfig.model_validate(job["train"])
    log.info("job %s: rank %d of %d on a warm worker group, pid %d, %s", job["trial_id"], ctx.rank,
             ctx.world_size, os.getpid(), job.get("sampled", {}))
    resume = resume_state([Path(p) for p in job["resume"]])  # newest first; checked here, where it is read
    try:
        run_training(cfg, ctx, GangReporter(desk, job, ctx), resume, job.get("run_dir"))
        return "done", ""
    except TrialStopped:
        return "stopped", ""
    except NonFiniteLoss as exc:  # raised on every rank at the same step: the gang can serve on
        return "error", f"{type(exc).__name__}: {exc}"
    finally:
        free_cuda_memory()


@contextmanager
def job_logs(rank: int, job_dir: str | None, gang_dir: str) -> Iterator[None]:
    """A launch's job logs into its own run folder (logs/rank-N.log), as on a worker group of its own."""
    from orchestrator.logs import setup_rank_logging

    if job_dir:
        setup_rank_logging(rank, job_dir)
    try:
        yield
    finally:
        if job_dir:
            setup_rank_logging(rank, gang_dir)


def free_cuda_memory() -> None:
    """Give this trial's GPU memory back before the next trial's model arrives. A full gc.collect (for
    modules caught in reference cycles) takes ~0.3 s with torch loaded, a third of a digits trial: on CPU,
    reference counting and Python's own collections are enough."""
    import torch

    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()


def gang_worker(config: dict[str, Any]) -> None:
    """A gang's worker (a Ray Train worker): run the jobs its desk hands out until the sweep ends. An error
    that is not the trial's own fails this worker, so Ray Train restarts the group (FailureConfig)."""
    from orchestrator.logs import setup_rank_logging
    from orchestrator.worker import ray_context

    ctx = ray_context()
    setup_rank_logging(ctx.rank, config["log_dir"])
    # What every job would pay first, paid once before the first job: the loop's imports (torch.optim imports
    # torch._dynamo when the first optimizer is built: 1-2 s) and the CUDA context (seconds).
    import torch
    import torch._dynamo  # noqa: F401

    import trainables.run  # noqa: F401

    if ctx.device.type == "cuda":
        torch.empty(1, device=ctx.device)

    desk = ray.get_actor(config["desk"], namespace=config.get("desk_namespace"))
    if ctx.is_main:
        ray.get(desk.join.remote())
    log.info("gang worker %d of %d ready, pid %d", ctx.rank, ctx.world_size, os.getpid())
    while True:
        job = agree(ctx.is_main, ctx.distributed, ctx.device, lambda: ray.get(desk.next_job.remote(POLL_S)))
        if "closed" in job:
            return
        started = time.perf_counter()
        try:
            with job_logs(ctx.rank, job.get("log_dir"), config["log_dir"]):
                kind, message = run_job(job, ctx, desk)
        except Exception as exc:
            desk.end.remote(job["seq"], "error", f"{GANG_FAILED}: rank {ctx.rank}: {type(exc).__name__}: {exc}")
            raise
        log.info("job %s ended (%s) after %.2f s", job["trial_id"], kind, time.perf_counter() - started)
        if ctx.is_main:
            ray.get(desk.end.remote(job["seq"], kind, message))


# --- the trial's side -------------------------------------------------------------------------------------


class KeepAlive(Periodic):
    """Tells the desk this trial lives while it waits on Tune; when Tune kills the trial's actor, the calls
    stop and the desk frees the gang (see desk.LEASE_S)."""

    def __init__(self, desk: Any, trial_id: str) -> None:
        super().__init__(1.0, "gang-keepalive")
        self.desk, self.trial_id = desk, trial_id

    def tick(self) -> None:
        self.desk.alive.remote(self.trial_id)


def claim(desk_names: list[str], trial_id: str, timeout_s: float = 600.0, namespace: str | None = None) -> Any:
    """A free gang's desk for this job. Tune runs no more trials at once than there are gangs, so one frees
    up as soon as the trial before it has left; a launch waits for the pool's job before it to end."""
    desks = [ray.get_actor(name, namespace=namespace) for name in desk_names]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for desk in desks:
            answer = ray.get(desk.claim.remote(trial_id))
            if answer is True:
                return desk
            if isinstance(answer, str):
                raise JobFailed(f"the warm worker groups are gone: {answer}")
        time.sleep(0.05)
    raise RuntimeError(f"no worker group came free within {timeout_s:.0f} s")


def relay(desk: Any, trial_id: str, on_report: Callable[[dict[str, Any], str | None], None],
          on_row: Callable[[dict[str, float]], None] | None = None) -> None:
    """Pass the gang's rows and reports on until its job ends. Each report is acknowledged once `on_report`
    returns, which lets the gang train on (for a sweep: once Tune let the trial continue)."""
    while True:
        for item in ray.get(desk.take.remote(trial_id, POLL_S)):
            if item["kind"] == "done":
                return
            if item["kind"] == "row":
                if on_row is not None:
                    on_row(item["row"])
                continue
            if item["kind"] != "report":
                raise JobFailed(item["message"] or f"the worker group ended the job ({item['kind']})")
            on_report(item["metrics"], item["path"])
            ray.get(desk.ack.remote(trial_id, item["index"]))


def to_tune(metrics: dict[str, Any], path: str | None) -> None:
    """A sweep trial's report: tune.report returns when Tune lets the trial go on, and raises SystemExit in
    this thread when Tune stops it (serve's `finally` lets go of the desk)."""
    from ray import tune

    tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(path) if path else None)
    if path:
        shutil.rmtree(path, ignore_errors=True)  # Tune keeps its own copy


def serve(desk_names: list[str], job: dict[str, Any], on_report: Callable[[dict[str, Any], str | None], None],
          on_row: Callable[[dict[str, float]], None] | None = None, claim_timeout_s: float = 600.0,
          namespace: str | None = None) -> None:
    """Run one job (a sweep trial, or a launch) on a gang: claim, submit, relay, let go."""
    trial_id = job["trial_id"]
    desk = claim(desk_names, trial_id, claim_timeout_s, namespace)
    try:
        with KeepAlive(desk, trial_id):
            ray.get(desk.submit.remote(trial_id, job))
            relay(desk, trial_id, on_report, on_row)
    finally:
        desk.release.remote(trial_id)
        shutil.rmtree(job["staging"], ignore_errors=True)  # reports nobody took


def serve_trial(desk_names: list[str], job: dict[str, Any]) -> None:
    """Run one Tune trial on one of the sweep's gangs."""
    # One line per checkpoint from Ray ("Checkpoint successfully created") is noise in a sweep's output.
    logging.getLogger("ray.train").setLevel(logging.WARNING)
    serve(desk_names, job, to_tune)


# --- the driver's side ------------------------------------------------------------------------------------


def desk_prefix(sweep_name: str) -> str:
    """The start of the names of a sweep's desks; its trials find them by it."""
    return f"orchestrator-desk-{sweep_name}-"


@contextmanager
def gangs(base: LaunchConfig, the_plan: Any, sweep_dir: Path, count: int, max_failures: int) -> Iterator[list[str]]:
    """Start `count` gangs (each a TorchTrainer fit in a thread of this driver) and their desks; yields the
    desk names. On exit the desks close, the gangs' workers return, and each fit ends, removing its group."""
    from orchestrator.launcher import failure_line, make_trainer

    names = [f"{desk_prefix(sweep_dir.name)}{i}" for i in range(count)]
    desks = [Desk.options(name=name).remote() for name in names]
    ray.get([d.__ray_ready__.remote() for d in desks])  # up before any trial looks for them

    def fit(index: int) -> None:
        run_dir = sweep_dir / "gangs" / f"gang-{index}"
        cfg = base.model_copy(update={"max_failures": max_failures, "name": run_dir.name})
        trainer = make_trainer(cfg, the_plan, run_dir, sink=None, worker=gang_worker,
                               extra={"desk": names[index]})
        try:
            trainer.fit()
        except Exception as exc:  # out of restarts: the trials waiting on this gang fail with the cause
            why = f"worker group {index} failed: {failure_line(exc, [], run_dir)}"
            log.error(why)
            desks[index].close.remote(why)

    threads = [threading.Thread(target=fit, args=(i,), name=f"gang-{i}", daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    try:
        yield names
    finally:
        for desk in desks:
            desk.close.remote("")
        for thread in threads:
            thread.join(timeout=120)
        for desk in desks:
            ray.kill(desk)
