"""Data parallel across workers: one replica per worker, gradients averaged by all-reduce in backward."""

from __future__ import annotations

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainables.context import DistContext


def wrap_ddp(model: nn.Module, ctx: DistContext, compressed: bool = False) -> nn.Module:
    """DDP over the workers. One worker needs no all-reduce and gets the bare model, unless it asked for
    gradient compression: then a DDP of one runs the hook, so its cost per step can be measured on one GPU."""
    model = model.to(ctx.device)
    if not (ctx.distributed or (compressed and ctx.grouped)):
        return model
    # device_ids only for a module on one CUDA device; CPU (and multi-device) modules take None.
    device_ids = [ctx.device] if ctx.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)
