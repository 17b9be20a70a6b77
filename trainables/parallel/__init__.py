"""Strategies that wrap a built model for distribution. The loop never knows which one it got."""

from __future__ import annotations

from torch import nn


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside DDP/DataParallel/compile wrappers: its state_dict has stage-independent names."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)  # DDP/DP, torch.compile
        if not isinstance(inner, nn.Module):
            return model
        model = inner
