"""A model's blocks: the units FSDP shards one by one and activation checkpointing recomputes.

The model's `fsdp_blocks()` method if it has one (the hook for a user's model: return the list of
submodules), else its layers as model parallel sees them (`pipeline_layers()` of the built-in models:
embedding, transformer blocks, head; a torchvision ResNet's blocks), else its top-level children. Left out,
to stay with the root: modules the model does not call itself (a ResNet's stem, grouped for the pipeline),
blocks without parameters, and blocks that share a parameter with another (GPT's tied embedding and head)."""

from __future__ import annotations

import sys
from collections import Counter

import torch
import torch.utils.checkpoint
from torch import nn

from trainables.models.vision import resnet_layers


def pipeline_layers(model: nn.Module) -> list[nn.Module] | None:
    """The model as a sequence of layers, each feeding the next, where it says (or is a torchvision ResNet)."""
    if hasattr(model, "pipeline_layers"):
        return list(model.pipeline_layers())
    torchvision = sys.modules.get("torchvision")  # imported already if the model came from it
    if torchvision is not None and isinstance(model, torchvision.models.ResNet):
        return resnet_layers(model)
    return None


def candidates(model: nn.Module) -> list[nn.Module]:
    if callable(getattr(type(model), "fsdp_blocks", None)):
        return list(model.fsdp_blocks())
    return pipeline_layers(model) or list(model.children())


def blocks_of(model: nn.Module) -> list[nn.Module]:
    registered = {id(m) for m in model.modules()}
    found = [b for b in candidates(model) if id(b) in registered and b is not model]
    owners = Counter(id(p) for block in found for p in block.parameters())
    return [b for b in found if any(True for _ in b.parameters()) and all(owners[id(p)] == 1 for p in b.parameters())]


def checkpoint_activations(model: nn.Module, mode: str) -> None:
    """Recompute the activations of every block (full) or every second one (selective) in backward. The
    block's forward is wrapped in place, so parameter names (and checkpoints) stay as they were."""
    if mode == "none":
        return
    chosen = blocks_of(model)[:: 1 if mode == "full" else 2]
    for block in chosen:
        block.forward = _recomputed(block.forward)


def _recomputed(forward):  # noqa: ANN001, ANN202 (any module's forward)
    def run(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run
