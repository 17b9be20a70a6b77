"""Strategies that wrap a built model for distribution. The loop never knows which one it got."""

from __future__ import annotations

from torch import nn


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside DDP/DataParallel wrappers: its state_dict has stage-independent names."""
    while hasattr(model, "module") and isinstance(model.module, nn.Module):
        model = model.module
    return model
