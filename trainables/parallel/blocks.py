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
    """Recompute the activations of every block (full), every second one (selective), or, in every block, those
    of its cheap ops only (op: see SAVED_OPS) in backward. The block's forward is wrapped in place, so
    parameter names (and checkpoints) stay as they were."""
    if mode == "none":
        return
    chosen = blocks_of(model)[:: 2 if mode == "selective" else 1]
    for block in chosen:
        block.forward = _recomputed(block.forward, saving_ops if mode == "op" else None)


def _recomputed(forward, context_fn=None):  # noqa: ANN001, ANN202 (any module's forward)
    options = {"context_fn": context_fn} if context_fn else {}

    def run(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **options, **kwargs)

    return run


# What per-op checkpointing keeps: the outputs of the ops that cost compute (matmuls, attention) or traffic (a
# collective's); in backward only the cheap ops between them run again (norms, RoPE, activations and the
# products around them, whose outputs are as wide as the matmuls' and many more).
SAVED_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
}


def saving_ops() -> tuple:
    """A block's per-op policy, for torch.utils.checkpoint's context_fn (called at each forward)."""
    decision = torch.utils.checkpoint.CheckpointPolicy

    def policy(ctx, func, *args, **kwargs) -> decision:  # noqa: ANN001, ANN002, ANN003
        return decision.MUST_SAVE if func in SAVED_OPS else decision.PREFER_RECOMPUTE

    return torch.utils.checkpoint.create_selective_checkpoint_contexts(policy)
