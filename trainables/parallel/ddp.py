"""Data parallel across workers: one replica per worker, gradients averaged by all-reduce in backward."""

from __future__ import annotations

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainables.context import DistContext


def wrap_ddp(model: nn.Module, ctx: DistContext) -> nn.Module:
    model = model.to(ctx.device)
    if not ctx.distributed:
        return model
    # device_ids only for a module on one CUDA device; CPU (and multi-device) modules take None.
    device_ids = [ctx.device] if ctx.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)
