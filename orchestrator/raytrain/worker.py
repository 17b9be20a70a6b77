"""What runs inside each Ray Train worker of a group of its own: turn Ray's context into the loop's (rank,
devices, reporter) and run the job: the shared loop, or the user's own `--entry` function. Kept in a module,
not __main__, so it pickles."""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
import ray.train
import ray.train.torch
import torch.distributed as dist
from ray.train.v2._internal.execution.context import get_train_context as get_internal_train_context

from groundwork import remote
from groundwork.errors import CheckpointError, ConfigError, Preempted
from orchestrator.raytrain.function import run_function
from orchestrator.raytrain.holders import holding
from orchestrator.raytrain.job import Job, WorkerArgs
from orchestrator.raytrain.logs import rank_output, setup_rank_logging
from orchestrator.raytrain.preemption import end_if_told, told
from orchestrator.raytrain.script import run_script
from orchestrator.raytrain.watchdog import Heartbeat
from trainables.checkpoint import load_latest, resume_state
from trainables.config import TrainConfig, for_world
from trainables.context import DistContext
from trainables.run import run_training

log = logging.getLogger("orchestrator.worker")


class RayReporter:
    """Rows to the driver's MetricsSink (async); checkpoints through ray.train.report (collective); progress
    to this rank's heartbeat thread; a preemption notice from Ray or SIGTERM, after whose checkpoint the rank
    told ends (see orchestrator.raytrain.preemption)."""

    def __init__(self, sink: Any, heartbeat: Heartbeat | None = None, upload_async: bool = False) -> None:
        self.sink = sink
        self.heartbeat = heartbeat
        self.upload_async = upload_async  # storage on a URI: Ray uploads each checkpoint while training goes on

    def log(self, row: dict[str, float]) -> None:
        if self.sink is not None:
            self.sink.push.remote(row)

    def checkpoint(self, metrics: dict[str, float], folder: str | None,
                   finish: Callable[[], None] | None = None) -> None:
        notice = bool(metrics.get("preemption_notice"))  # the same on every rank (see trainables.context)
        if folder and in_run_folder(folder):  # a sharded checkpoint: every rank wrote into the run's folder
            checkpoint_in_place(metrics, folder, finish)
        elif self.upload_async and not notice:
            self.checkpoint_async(metrics, folder)
            return
        else:
            ckpt = ray.train.Checkpoint.from_directory(folder) if folder else None
            ray.train.report(metrics, checkpoint=ckpt)  # rank 0's returns once its folder is stored
        if notice:
            if dist.is_initialized():
                dist.barrier()  # so the rank told does not end (and its group with it) before that
            end_if_told(int(metrics.get("step", -1)))

    @staticmethod
    def checkpoint_async(metrics: dict[str, float], folder: str | None) -> None:
        """Train V2's asynchronous upload: Ray copies the folder to the storage in a thread of its own and
        deletes it after (the loop removes `folder` when this returns, so Ray gets it under another name); the
        report waits for the other ranks in that thread too. A run's end waits for every upload."""
        ckpt, taken = None, None
        if folder:
            taken = f"{folder}-upload"
            os.rename(folder, taken)
            ckpt = ray.train.Checkpoint.from_directory(taken)
        try:
            ray.train.report(metrics, checkpoint=ckpt, checkpoint_upload_mode=ray.train.CheckpointUploadMode.ASYNC,
                             delete_local_checkpoint_after_upload=True)
        except BaseException:
            if taken:
                shutil.rmtree(taken, ignore_errors=True)  # never handed to Ray's upload
            raise

    def progress(self, step: int) -> None:
        if self.heartbeat is not None:
            self.heartbeat.tick_step(step)

    def preemption_notice(self) -> bool:
        """What Ray Train's controller told this worker of a node being drained for preemption (a spot
        reclaim): read locally, as ray.train.get_preemption_info would before its collective (Ray 2.60); or
        SIGTERM to this process."""
        if told():
            return True
        try:
            return get_internal_train_context().preemption_context.preemption_info is not None
        except (AttributeError, RuntimeError):
            return False


def run_folder() -> Path:
    """Where Ray Train keeps this run's checkpoints (a sharded run's: a local path, which the nodes share)."""
    return Path(ray.train.get_context().get_storage().experiment_fs_path).resolve()


def in_run_folder(folder: str) -> bool:
    return Path(folder).resolve().parent == run_folder()


def checkpoint_in_place(metrics: dict[str, float], folder: str, finish: Callable[[], None] | None) -> None:
    """Rank 0's report of a checkpoint every rank wrote into the run's folder on the storage (sharded): Ray
    gives it its checkpoint name there, with no copy (`checkpoint_upload_fn`). Written in the background
    (`finish`): Ray's upload thread waits for it and completes it, the report returns at once, and the run's
    end waits for it."""
    def into_place(_: ray.train.Checkpoint, name: str) -> ray.train.Checkpoint:
        if finish is not None:
            finish()
        os.replace(folder, run_folder() / name)
        return ray.train.Checkpoint.from_directory(str(run_folder() / name))

    mode = ray.train.CheckpointUploadMode.ASYNC if finish else ray.train.CheckpointUploadMode.SYNC
    ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(folder), checkpoint_upload_mode=mode,
                     checkpoint_upload_fn=into_place, delete_local_checkpoint_after_upload=False)


def ray_context() -> DistContext:
    ctx = ray.train.get_context()
    return DistContext(
        rank=ctx.get_world_rank(),
        world_size=ctx.get_world_size(),
        local_rank=ctx.get_local_rank(),
        # Ray narrows CUDA_VISIBLE_DEVICES per worker; get_devices maps them, so never assume cuda:0.
        devices=tuple(ray.train.torch.get_devices()),
    )


def latest_state(job: Job, ctx: DistContext) -> dict[str, Any] | None:
    """The newest complete checkpoint to start from (see Job.checkpoint_folders), or None for a fresh start.
    Each is checked against its manifest; a cut-short or corrupt one is skipped."""
    if job.remote:
        return remote_state(job.remote, Path(job.run_dir or ".") / ".fetched", ctx)
    ckpt = ray.train.get_checkpoint()
    return resume_state(job.checkpoint_folders(Path(ckpt.path) if ckpt else None))


def remote_state(uri: str, scratch: Path, ctx: DistContext) -> dict[str, Any] | None:
    """latest_state for a run folder on a URI: its checkpoints copied to each node once (by the node's first
    rank, the others waiting), one at a time, newest first, until one passes its manifest."""
    names = remote.checkpoint_names(uri)
    for name in names:
        folder = scratch / name
        if ctx.local_rank == 0:
            remote.fetch(uri, name, folder)
        together(ctx)
        found = load_latest([folder])
        together(ctx)  # every rank of the node has read it
        if ctx.local_rank == 0:
            shutil.rmtree(folder, ignore_errors=True)
        if found is not None:
            log.info("resuming from %s", remote.join(uri, name))
            return found[1]
    if names:
        raise CheckpointError(f"no complete checkpoint to resume from in {uri}: every one failed its manifest")
    return None


def together(ctx: DistContext) -> None:
    if ctx.distributed:
        dist.barrier()


def fetch_log(job: Job, rank: int) -> None:
    """A resumed run's log for this rank from the URI, where this node's staging copy lacks it (the driver's
    node has it already): the rank appends to it, and its upload replaces the one there."""
    local = Path(job.log_dir or ".") / f"rank-{rank}.log"
    if job.remote and not local.exists():
        with contextlib.suppress(OSError, ConfigError):  # none yet (a new run), or unreachable: start a new one
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_bytes(remote.RunPlace.at(job.remote).read(f"logs/{local.name}"))


def upload_log(job: Job, rank: int) -> None:
    """This rank's log to the run folder's URI (each node keeps its ranks' logs in its own staging copy)."""
    local = Path(job.log_dir or ".") / f"rank-{rank}.log"
    if job.remote and local.exists():
        try:
            fs, base = remote.open_uri(remote.join(job.remote, "logs", local.name))
            remote.upload_file(local, fs, base)
        except (OSError, ConfigError) as exc:  # the run's own end (or error) is not replaced by its log's
            log.warning("rank %d: its log did not reach %s: %s", rank, job.remote, exc)


def heartbeat(sink: Any, ctx: DistContext) -> contextlib.AbstractContextManager:
    if sink is None:
        return contextlib.nullcontext()
    # Pickled here, unpickled by the sink only to kill a hung group: a handle unpickled on arrival would make
    # the sink import Ray Train's worker module (~0.8 s of CPU, while the workers start).
    worker = pickle.dumps(ray.get_runtime_context().current_actor)
    return Heartbeat(sink, ctx.rank, ray.get_runtime_context().get_node_id(), worker)


def train_for(job: Job, ctx: DistContext) -> TrainConfig:
    """The job's settings on the workers this (re)start got: an elastic run keeps its global batch."""
    train, change = for_world(job.train, ctx.world_size, job.planned_world)
    if change and ctx.is_main:
        log.warning("%s", change)
    return train


def run_rank(args: WorkerArgs) -> None:
    """One rank's whole job (entered through orchestrator.raytrain.entry.train_worker)."""
    ctx = ray_context()
    job = args.job
    fetch_log(job, ctx.rank)
    setup_rank_logging(ctx.rank, job.log_dir)
    log.info("rank %d of %d on node %s, pid %d, devices %s", ctx.rank, ctx.world_size,
             ray.get_runtime_context().get_node_id(), os.getpid(), [str(d) for d in ctx.devices])
    if args.on_start is not None and ctx.is_main:
        args.on_start()
    # A script's output is copied into the log by run_script itself.
    output = contextlib.nullcontext() if job.kind == "script" else rank_output(ctx.rank, job.log_dir)
    held = holding(job.name, ctx.rank, ray.get_runtime_context().get_node_id())  # named in `orchestrator top`
    with heartbeat(args.sink, ctx) as beat, output, held:
        try:
            if job.kind == "function":
                run_function(job, ctx, args.sink, beat)
            elif job.kind == "script":
                run_script(job, ctx, args.sink, beat)
            else:
                reporter = RayReporter(args.sink, beat, upload_async=job.remote is not None)
                run_training(train_for(job, ctx), ctx, reporter, latest_state(job, ctx), job.run_dir, job.user)
        except Preempted as told_to_stop:  # asked for: its message says all (see raytrain.preemption)
            log.warning("%s", told_to_stop)
            raise
        except Exception:
            log.exception("rank %d failed", ctx.rank)  # the whole traceback, in this rank's own log
            raise
        finally:
            upload_log(job, ctx.rank)
