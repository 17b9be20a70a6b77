"""Strategies that wrap a built model for distribution. The loop never knows which one it got."""

from __future__ import annotations

import torch
from torch import nn

from trainables.config import TrainConfig
from trainables.context import DistContext


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


def parallelize(model: nn.Module, cfg: TrainConfig, ctx: DistContext) -> nn.Module:
    """Wrap a built model in the configured strategy; the loop only ever sees the result."""
    if cfg.strategy == "model-parallel":
        from trainables.parallel.pipeline import pipeline_ddp

        return pipeline_ddp(model, cfg, ctx)
    if cfg.compile:
        model = torch.compile(model)  # compiled before DDP wraps it, as the DDP + compile docs advise
    if cfg.strategy == "dp":
        from trainables.parallel.dp import wrap_dp

        return wrap_dp(model, ctx)
    from trainables.parallel.ddp import wrap_ddp

    return wrap_ddp(model, ctx)
