"""Strategies that wrap a built model for distribution: DDP, FSDP2, model parallel, DataParallel. The loop
never knows which one it got: it gets the wrapped model and, from the strategy, how to skip gradient sync on
the micro-batches before an optimizer step (Lightning Fabric's `no_backward_sync`, owned by the strategy)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainables.config import TrainConfig
from trainables.context import DistContext
from trainables.parallel.blocks import checkpoint_activations
from trainables.parallel.comm import AllReduceTimer, register_comm
from trainables.parallel.ddp import wrap_ddp
from trainables.parallel.dp import wrap_dp
from trainables.parallel.float8 import float8_linears
from trainables.parallel.pipeline import pipeline_ddp


@dataclass(frozen=True)
class Parallel:
    """A model wrapped by its strategy, and that strategy's way to accumulate gradients locally."""

    model: nn.Module  # what the loop calls
    no_sync: Callable[[], contextlib.AbstractContextManager]  # a micro-batch under it does not all-reduce
    comm: AllReduceTimer | None = None  # times DDP's gradient all-reduce, for the rows' telemetry


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside DDP/DataParallel/compile wrappers: its state_dict has stage-independent names."""
    while True:
        # DDP/DP keep it in .module, torch.compile in ._orig_mod. No `or` between them: a compiled module's
        # truth value calls len() on the model inside, which a plain nn.Module does not support.
        inner = getattr(model, "module", None)
        if inner is None:
            inner = getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def _with_no_sync(model: nn.Module, cfg: TrainConfig) -> Parallel:
    # DDP all-reduces in backward unless told not to; one process, or DataParallel, has nothing to skip.
    if isinstance(model, DistributedDataParallel):
        return Parallel(model, model.no_sync, register_comm(model, cfg))
    return Parallel(model, contextlib.nullcontext)


def is_sharded(model: nn.Module) -> bool:
    """Whether FSDP2 holds `model`. FSDP and DCP (with DTensor and sympy: ~0.5 s of import in every worker and
    driver) are imported by the runs that shard or write sharded checkpoints only, so a process that never
    imported FSDP holds no model of it."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and isinstance(unwrap(model), fsdp.FSDPModule)


def parallelize(model: nn.Module, cfg: TrainConfig, ctx: DistContext) -> Parallel:
    """Wrap a built model in the configured strategy; the loop only ever sees the result."""
    checkpoint_activations(model, cfg.activation_checkpointing)
    if cfg.precision == "fp8":
        float8_linears(model, cfg, ctx)
    if cfg.strategy == "model-parallel":
        return _with_no_sync(pipeline_ddp(model, cfg, ctx), cfg)
    if cfg.sharded and ctx.grouped:  # one worker too: offload and per-block gathering work on one GPU
        from trainables.parallel.fsdp import no_gradient_sync, wrap_fsdp  # deferred: see is_sharded

        sharded = wrap_fsdp(model, cfg, ctx)
        # compiled after sharding: FSDP's hooks sit on the blocks, which the compiled graph calls
        return Parallel(torch.compile(sharded) if cfg.compile else sharded, lambda: no_gradient_sync(sharded))
    if cfg.compile:
        model = torch.compile(model)  # compiled before DDP wraps it, as the DDP + compile docs advise
    if cfg.strategy == "dp":
        return _with_no_sync(wrap_dp(model, ctx), cfg)
    return _with_no_sync(wrap_ddp(model, ctx, compressed=cfg.grad_compression != "none"), cfg)
