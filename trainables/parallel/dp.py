"""Legacy torch.nn.DataParallel inside one worker, kept for parity with older setups: it replicates the
model on every step from one Python thread and is slower than DDP, which is the default."""

from __future__ import annotations

from torch import nn

from groundwork.errors import ConfigError
from trainables.context import DistContext


def check_one_worker(workers: int) -> None:
    if workers > 1:
        raise ConfigError(f"strategy dp runs in one worker, not {workers}: use ddp across workers")


def wrap_dp(model: nn.Module, ctx: DistContext) -> nn.Module:
    check_one_worker(ctx.world_size)
    model = model.to(ctx.device)
    cuda = [d for d in ctx.devices if d.type == "cuda"]
    return nn.DataParallel(model, device_ids=cuda) if len(cuda) > 1 else model
