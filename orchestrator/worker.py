"""What runs inside each Ray Train worker: turn Ray's context into the loop's (rank, devices, reporter) and
call the shared loop, or the user's own `--entry` function. Kept in a module, not __main__, so it pickles."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
import ray.train
import ray.train.torch

from orchestrator.logs import setup_rank_logging
from orchestrator.watchdog import Heartbeat
from trainables.checkpoint import checkpoints_in, resume_state
from trainables.config import TrainConfig
from trainables.context import DistContext
from trainables.run import run_training

log = logging.getLogger("orchestrator.worker")


class RayReporter:
    """Rows to the driver's MetricsSink (async); checkpoints through ray.train.report (collective); progress
    to this rank's heartbeat thread."""

    def __init__(self, sink: Any, heartbeat: Heartbeat | None = None) -> None:
        self.sink = sink
        self.heartbeat = heartbeat

    def log(self, row: dict[str, float]) -> None:
        if self.sink is not None:
            self.sink.push.remote(row)

    def checkpoint(self, metrics: dict[str, float], folder: str | None) -> None:
        ckpt = ray.train.Checkpoint.from_directory(folder) if folder else None
        ray.train.report(metrics, checkpoint=ckpt)

    def progress(self, step: int) -> None:
        if self.heartbeat is not None:
            self.heartbeat.tick_step(step)


def ray_context() -> DistContext:
    ctx = ray.train.get_context()
    return DistContext(
        rank=ctx.get_world_rank(),
        world_size=ctx.get_world_size(),
        local_rank=ctx.get_local_rank(),
        # Ray narrows CUDA_VISIBLE_DEVICES per worker; get_devices maps them, so never assume cuda:0.
        devices=tuple(ray.train.torch.get_devices()),
    )


def resolve_entry(entry: str) -> Callable[[dict[str, Any]], Any]:
    module, _, func = entry.partition(":")
    return getattr(importlib.import_module(module), func)


def latest_state(run_dir: str | None, resuming: bool = False) -> dict[str, Any] | None:
    """The newest complete checkpoint of this run, or None for a fresh start.

    Ray's latest (`get_checkpoint`, set when resuming or restarting after a failure) can be older than what
    is on disk: the controller learns of a report only when it next polls the workers, so one written just
    before a worker died is complete but unregistered. And a run that ran on a warm pool (orchestrator.pool)
    has checkpoints Ray never saw: a --resume looks on disk even when Ray knows of none. Newest first by name
    (the names sort by time), each checked against its manifest; a cut-short or corrupt one is skipped."""
    ckpt = ray.train.get_checkpoint()
    if ckpt is None and not resuming:
        return None
    on_disk = checkpoints_in(run_dir) if run_dir else []
    return resume_state(on_disk if ckpt is None or Path(ckpt.path) in on_disk else [Path(ckpt.path), *on_disk])


def heartbeat(config: dict[str, Any], ctx: DistContext) -> contextlib.AbstractContextManager:
    if config.get("sink") is None:
        return contextlib.nullcontext()
    worker = ray.get_runtime_context().current_actor
    return Heartbeat(config["sink"], ctx.rank, ray.get_runtime_context().get_node_id(), worker)


def train_worker(config: dict[str, Any]) -> None:
    ctx = ray_context()
    setup_rank_logging(ctx.rank, config.get("log_dir"))
    log.info("rank %d of %d on node %s, pid %d, devices %s", ctx.rank, ctx.world_size,
             ray.get_runtime_context().get_node_id(), os.getpid(), [str(d) for d in ctx.devices])
    if config.get("pg_registry") and ctx.is_main:  # inside a sweep trial: let the sweep reap our group
        from orchestrator.sweeps.reaper import register_current_group

        register_current_group(config["pg_registry"], config["trial_id"])
    if config.get("entry"):
        resolve_entry(config["entry"])(config["user_config"])
        return
    cfg = TrainConfig.model_validate(config["train"])
    with heartbeat(config, ctx) as beat:
        run_dir = config.get("run_dir")
        run_training(cfg, ctx, RayReporter(config.get("sink"), beat),
                     latest_state(run_dir, config.get("resuming", False)), run_dir)
