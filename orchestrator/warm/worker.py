"""A warm group's side: every rank of it runs the jobs its desk hands out, one after another, on the process
group it already has, until the desk closes.

Only rank 0 talks to the desk; the other ranks learn each answer from it by broadcast (`agree`). A job that
fails with its own error (a JobError, raised alike on every rank: a non-finite loss, no usable checkpoint to
resume from) ends with that error and the group serves on; any other exception fails the worker, so Ray Train
restarts the group (FailureConfig) and the job it was running ends as the group's failure.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import ray
import torch

from groundwork.errors import JobError
from orchestrator.raytrain.holders import holding
from orchestrator.raytrain.job import Job
from orchestrator.raytrain.logs import setup_rank_logging
from orchestrator.raytrain.worker import ray_context
from orchestrator.warm.desk import GROUP_FAILED, Closed, Ended
from orchestrator.warm.reporter import POLL_S, GroupReporter, Stopped, agree
from trainables.checkpoint import resume_state
from trainables.context import DistContext, Reporter
from trainables.run import run_training

log = logging.getLogger("orchestrator.warm")


@dataclass(frozen=True)
class GroupArgs:
    """Every rank's argument in a warm group: its desk, and where the group itself logs."""

    desk: str
    namespace: str | None
    log_dir: str


def run_job(job: Job, ctx: DistContext, reporter: Reporter) -> Ended:
    """Run one job of the shared loop on this rank and say how it ended: done, stopped, or an error of the
    job's own (the group serves on). Any other exception is the group's failure and propagates."""
    log.info("job %s: rank %d of %d on a warm group, pid %d, %s", job.name, ctx.rank, ctx.world_size,
             os.getpid(), job.sampled)
    try:
        # Read here, inside the try: no usable checkpoint is the job's error, not the group's.
        resume = resume_state([Path(p) for p in job.resume])
        with holding(job.name, ctx.rank, ray.get_runtime_context().get_node_id()):
            run_training(job.train, ctx, reporter, resume, job.run_dir, job.user)
    except Stopped:
        return Ended("stopped")
    except JobError as exc:
        return Ended("error", f"{type(exc).__name__}: {exc}")
    finally:
        free_cuda_memory()
    return Ended("done")


@contextmanager
def job_logs(rank: int, job: Job, group_log_dir: str) -> Iterator[None]:
    """A job with a log folder of its own (a launch) logs there, as on a worker group of its own."""
    if job.log_dir:
        setup_rank_logging(rank, job.log_dir)
    try:
        yield
    finally:
        if job.log_dir:
            setup_rank_logging(rank, group_log_dir)


def free_cuda_memory() -> None:
    """Give this job's GPU memory back before the next job's model arrives. A full gc.collect (for modules
    caught in reference cycles) takes ~0.3 s with torch loaded, a third of a digits trial: on CPU, reference
    counting and Python's own collections are enough."""
    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()


def group_worker(args: GroupArgs) -> None:
    """A warm group's worker (a Ray Train worker): run the jobs its desk hands out until the desk closes."""
    ctx = ray_context()
    setup_rank_logging(ctx.rank, args.log_dir)
    # What every job would pay first, paid once before the first job: torch.optim imports torch._dynamo when
    # the first optimizer is built (1-2 s; deferred to here, since drivers import this module only to name
    # this function), and the CUDA context.
    import torch._dynamo  # noqa: F401

    if ctx.device.type == "cuda":
        torch.empty(1, device=ctx.device)
    desk = ray.get_actor(args.desk, namespace=args.namespace)
    if ctx.is_main:
        ray.get(desk.join.remote())
    log.info("warm group worker %d of %d ready, pid %d", ctx.rank, ctx.world_size, os.getpid())
    while True:
        assignment = agree(ctx, lambda: ray.get(desk.next_job.remote(POLL_S)))
        if isinstance(assignment, Closed):
            return
        started = time.perf_counter()
        try:
            with job_logs(ctx.rank, assignment.job, args.log_dir):
                ended = run_job(assignment.job, ctx, GroupReporter(desk, assignment, ctx))
        except Exception as exc:
            failed = Ended("error", f"{GROUP_FAILED}: rank {ctx.rank}: {type(exc).__name__}: {exc}")
            desk.end.remote(assignment.seq, failed)
            raise
        log.info("job %s ended (%s) after %.2f s", assignment.job.name, ended.how, time.perf_counter() - started)
        if ctx.is_main:
            ray.get(desk.end.remote(assignment.seq, ended))
