"""Gradient compression for DDP's all-reduce, by PyTorch's own comm hooks (the guide's "compress before
sending"): fp16/bf16 halve the bytes; PowerSGD sends a rank-r approximation of each large gradient matrix
(with error feedback), after `powersgd_warmup` steps of plain all-reduce. Each call also says how many bytes
it all-reduced, for the rows."""

# No `from __future__ import annotations`: DDP checks its hooks' annotations against the real classes.
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from trainables.config import TrainConfig

HOOKS = {"none": default_hooks.allreduce_hook, "fp16": default_hooks.fp16_compress_hook,
         "bf16": default_hooks.bf16_compress_hook, "powersgd": powerSGD_hook.powerSGD_hook}


class Compression:
    """One of PyTorch's all-reduce hooks with its state, and the bytes each bucket sent."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.kind = cfg.grad_compression
        self.hook = HOOKS[self.kind]
        self.state: Any = None  # the default process group, for the plain and half-precision hooks
        if self.kind == "powersgd":
            self.state = powerSGD_hook.PowerSGDState(
                process_group=None, matrix_approximation_rank=cfg.powersgd_rank,
                start_powerSGD_iter=cfg.powersgd_warmup, use_error_feedback=True, warm_start=True)

    def __call__(self, bucket: dist.GradBucket) -> tuple[torch.futures.Future[torch.Tensor], int]:
        before = self.state.total_numel_after_compression if self.kind == "powersgd" else 0
        future = self.hook(self.state, bucket)
        buffer = bucket.buffer()
        elements = buffer.numel()
        if self.kind == "powersgd":  # PowerSGD counts what it sends; nothing during its warm-up (plain)
            elements = (self.state.total_numel_after_compression - before) or elements
        size = 2 if self.kind in ("fp16", "bf16") else buffer.element_size()
        return future, elements * size
