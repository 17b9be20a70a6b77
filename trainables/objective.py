"""How a batch becomes a loss, for the built-in models and a user's own alike.

- `(x, y)` pairs (tuples or lists of two): the model gets `x`; the loss is `--loss`'s `fn(output, y)`, else the
  model's own loss if its output carries one, else cross-entropy of the output as logits (and then accuracy
  is measured too).
- dicts of tensors (as Hugging Face models take them): the model gets `**batch`; the loss is `fn(output,
  batch)`, else the output's own: a scalar tensor, `output["loss"]` or `output.loss`.
- anything else: the model gets the batch as it is; the loss as for dicts.
Batches move to the device as a whole (every tensor in them); uint8 `x` of a pair is scaled to [0, 1] there.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from groundwork.errors import ConfigError
from trainables.config import TrainConfig
from trainables.context import DistContext
from trainables.factories import resolve
from trainables.precision import MixedPrecision

LossFn = Callable[[Any, Any], torch.Tensor]


def to_device(x: torch.Tensor, y: torch.Tensor, ctx: DistContext,
              cfg: TrainConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Async copy to the worker's device (the loader pins memory on CUDA, so it overlaps compute). Images
    that come as uint8 are scaled to [0, 1] there, after the copy: a quarter of the bytes cross the bus."""
    fmt = torch.channels_last if cfg.channels_last and x.ndim == 4 else torch.contiguous_format
    x = x.to(ctx.device, non_blocking=True, memory_format=fmt)
    if x.dtype == torch.uint8:
        x = x.float().div_(255)  # elementwise: keeps channels_last
    return x, y.to(ctx.device, non_blocking=True)


def is_pair(batch: Any) -> bool:
    return isinstance(batch, tuple | list) and len(batch) == 2


def moved(batch: Any, device: torch.device) -> Any:
    """Every tensor in a (nested) batch, copied to `device`."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {k: moved(v, device) for k, v in batch.items()}
    if isinstance(batch, tuple | list):
        return type(batch)(moved(v, device) for v in batch)
    return batch


def batch_to_device(batch: Any, ctx: DistContext, cfg: TrainConfig) -> Any:
    if is_pair(batch) and isinstance(batch[0], torch.Tensor) and isinstance(batch[1], torch.Tensor):
        return to_device(batch[0], batch[1], ctx, cfg)
    return moved(batch, ctx.device)


def batch_size_of(batch: Any) -> int:
    """Samples in a batch: the leading size of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.ndim else 1
    values = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, tuple | list) else ()
    return next((batch_size_of(v) for v in values if isinstance(v, torch.Tensor | Mapping | tuple | list)), 1)


def cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every position, in fp32. Under --compile this is compiled too: fused, it never
    writes the fp32 copy of the logits (for GPT-2 at batch 16 x 1024, 3.3 GB per step)."""
    return F.cross_entropy(logits.flatten(0, -2).float(), y.to(logits.device).flatten())


@functools.cache
def compiled_cross_entropy() -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    return torch.compile(cross_entropy, dynamic=False)  # made on first use: importing dynamo takes seconds


def own_loss(output: Any) -> torch.Tensor | None:
    """The loss a model computed itself: a scalar output, `output["loss"]` or `output.loss`."""
    if isinstance(output, torch.Tensor):
        return output if output.ndim == 0 else None
    loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    return loss if isinstance(loss, torch.Tensor) else None


@dataclass(frozen=True)
class Forward:
    """One forward pass: the loss, and for the cross-entropy path the logits and targets (for accuracy)."""

    loss: torch.Tensor
    logits: torch.Tensor | None = None
    targets: torch.Tensor | None = None


@dataclass(frozen=True)
class Objective:
    loss_fn: LossFn | None = None  # --loss
    compile: bool = False  # cross-entropy compiled with the model (--compile)

    def forward(self, model: nn.Module, batch: Any, amp: MixedPrecision) -> Forward:
        """Model and loss on a batch already on the device."""
        if is_pair(batch):
            x, y = batch
            with amp.autocast():
                output = model(x)  # (B, classes) or (B, T, vocab), on the last pipeline stage's device
            if self.loss_fn is not None:
                return Forward(self.loss_fn(output, y))
            loss = own_loss(output)
            if loss is not None:
                return Forward(loss)
            return Forward((compiled_cross_entropy() if self.compile else cross_entropy)(output, y), output, y)
        with amp.autocast():
            output = model(**batch) if isinstance(batch, Mapping) else model(batch)
        if self.loss_fn is not None:
            return Forward(self.loss_fn(output, batch))
        loss = own_loss(output)
        if loss is None:
            raise ConfigError(f"the model's output ({type(output).__name__}) holds no loss for a"
                              f" {type(batch).__name__} batch: return one (a scalar tensor, ['loss'] or .loss),"
                              " pass --loss package.module:fn, or yield (x, y) pairs for cross-entropy")
        return Forward(loss)

    def eval_sums(self, model: nn.Module, batch: Any, amp: MixedPrecision) -> torch.Tensor:
        """(loss sum, correct, samples, samples with an accuracy) of one validation batch, float64."""
        out = self.forward(model, batch, amp)
        if out.logits is not None and out.targets is not None:
            logits, y = out.logits.flatten(0, -2).float(), out.targets.to(out.logits.device).flatten()
            n = torch.tensor(y.numel(), device=y.device, dtype=torch.float64)
            return torch.stack([F.cross_entropy(logits, y, reduction="sum").double(),
                                (logits.argmax(-1) == y).sum().double(), n, n])
        n = float(batch_size_of(batch))
        zero = torch.zeros((), device=out.loss.device, dtype=torch.float64)
        return torch.stack([out.loss.detach().double() * n, zero, zero + n, zero])


def objective_of(cfg: TrainConfig) -> Objective:
    return Objective(resolve(cfg.loss, "loss") if cfg.loss else None, cfg.compile)
