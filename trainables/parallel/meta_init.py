"""A sharded run builds its model once per job, not once per worker: rank 0 builds it in host memory as any run
does, every other rank on the meta device (shapes, no storage); FSDP shards both alike, the meta ranks then
allocate their shards only, and rank 0's weights are broadcast into every rank's shards. A node of 8 GPUs
holds one copy of the model in host memory rather than 8 (none on a node without rank 0), and the initial
weights are exactly those of a run that built the model everywhere from the same seed, as DDP's are.
(torchtitan builds every rank on meta and runs the model's own init on the shards; torchtune's and
Accelerate's `cpu_ram_efficient_loading` broadcast from rank 0, as here: any model, a user's too, keeps its
own init.) Here: whether a run does, and where its model is built; the broadcast is FSDP's
(trainables.parallel.fsdp: this module imports no torch.distributed.checkpoint, as the loop imports it)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from groundwork.errors import ConfigError
from trainables.config import TrainConfig
from trainables.context import DistContext


def meta_init(cfg: TrainConfig, ctx: DistContext) -> bool:
    """Whether this run builds its model on rank 0 only (sharded, more than one worker, not turned off)."""
    return cfg.sharded and cfg.meta_init and ctx.grouped and ctx.world_size > 1


@contextlib.contextmanager
def building_device(cfg: TrainConfig, ctx: DistContext) -> Iterator[None]:
    """Where the model's tensors go while it is built: the meta device on the ranks that get rank 0's weights.
    A model whose building reads its tensors' values (`.item()`, numpy) cannot be built there: one line says
    so, and how to build it everywhere instead."""
    if not (meta_init(cfg, ctx) and ctx.rank != 0):
        yield
        return
    try:
        with torch.device("meta"):
            yield
    except (RuntimeError, NotImplementedError, TypeError) as exc:  # .item(), copies out, numpy
        why = f"{type(exc).__name__}: {exc}"
        raise ConfigError(f"model {cfg.model} cannot be built on the meta device, where every worker but the"
                          f" first builds a sharded model ({why}): add --no-meta-init") from exc
