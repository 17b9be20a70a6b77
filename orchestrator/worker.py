"""What runs inside each Ray Train worker: turn Ray's context into the loop's (rank, devices, reporter) and
call the shared loop, or the user's own `--entry` function. Kept in a module, not __main__, so it pickles."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

import ray
import ray.train
import ray.train.torch

from orchestrator.logs import setup_rank_logging
from trainables.checkpoint import load_state
from trainables.config import TrainConfig
from trainables.context import DistContext
from trainables.run import run_training

log = logging.getLogger("orchestrator.worker")


class RayReporter:
    """Rows to the driver's MetricsSink (async); checkpoints through ray.train.report (collective)."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink

    def log(self, row: dict[str, float]) -> None:
        if self.sink is not None:
            self.sink.push.remote(row)

    def checkpoint(self, metrics: dict[str, float], folder: str | None) -> None:
        ckpt = ray.train.Checkpoint.from_directory(folder) if folder else None
        ray.train.report(metrics, checkpoint=ckpt)


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


def latest_state() -> dict[str, Any] | None:
    ckpt = ray.train.get_checkpoint()  # set when resuming a run or restarting after a failure
    if ckpt is None:
        return None
    with ckpt.as_directory() as folder:
        return load_state(folder)


def train_worker(config: dict[str, Any]) -> None:
    ctx = ray_context()
    setup_rank_logging(ctx.rank, config.get("log_dir"))
    log.info("rank %d of %d on node %s, devices %s", ctx.rank, ctx.world_size,
             ray.get_runtime_context().get_node_id(), [str(d) for d in ctx.devices])
    if config.get("pg_registry") and ctx.is_main:  # inside a sweep trial: let the sweep reap our group
        from orchestrator.sweeps.reaper import register_current_group

        register_current_group(config["pg_registry"], config["trial_id"])
    if config.get("entry"):
        resolve_entry(config["entry"])(config["user_config"])
        return
    cfg = TrainConfig.model_validate(config["train"])
    run_training(cfg, ctx, RayReporter(config.get("sink")), latest_state())
