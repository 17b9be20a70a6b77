"""A model's blocks: the units FSDP shards one by one and activation checkpointing recomputes.

The model's `fsdp_blocks()` method if it has one (the hook for a user's model: return the list of
submodules), else its layers as model parallel sees them (`pipeline_layers()` of the built-in models:
embedding, transformer blocks, head; a torchvision ResNet's blocks), else its top-level children. Left out,
to stay with the root: modules the model does not call itself (a ResNet's stem, grouped for the pipeline),
blocks without parameters, and blocks that share a parameter with another (GPT's tied embedding and head)."""

from __future__ import annotations

import contextlib
import importlib
import itertools
import sys
from collections import Counter
from collections.abc import Iterator

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
    if mode == "op":  # torch's own set (public), for the process: once, not at every block's forward
        torch.utils.checkpoint.SAC_IGNORED_OPS.update(unreplayed_ops())
    for block in chosen:
        block.forward = _recomputed(block.forward, saving_ops if mode == "op" else None, batch_norms_in(block))


def _recomputed(forward, context_fn=None, norms: list[nn.Module] = ()):  # noqa: ANN001, ANN202 (any forward)
    options = {"context_fn": context_fn} if context_fn else {}
    spares: list[torch.Tensor] = []  # made at the first forward, where the statistics are by then

    def run(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        # compiled, the recompute is the backward graph's, which repeats no buffer update
        if not norms or torch.compiler.is_compiling():
            return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **options, **kwargs)
        calls = itertools.count()  # checkpoint calls `once` for the forward, and again to recompute it
        if not spares or spares[0].device != norms[0].running_mean.device:
            spares[:] = spare_statistics(norms)

        def once(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            if next(calls) == 0:
                return forward(*args, **kwargs)
            with statistics_swapped(norms, spares):
                return forward(*args, **kwargs)
        return torch.utils.checkpoint.checkpoint(once, *args, use_reentrant=False, **options, **kwargs)

    return run


STATISTICS = ("running_mean", "running_var", "num_batches_tracked")  # a BatchNorm's buffers its forward updates


def batch_norms(module: nn.Module) -> list[nn.Module]:
    return [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def batch_norms_in(block: nn.Module) -> list[nn.Module]:
    """Those whose forward updates running statistics."""
    return [norm for norm in batch_norms(block) if norm.track_running_stats]


def spare_statistics(norms: list[nn.Module]) -> list[torch.Tensor]:
    """Copies of the norms' running statistics, made outside the checkpointed region (per-op checkpointing
    replays the ops inside it, and a copy made only in the recompute would be one it never saw). Made once
    per block: a recompute only writes them (training-mode BatchNorm normalizes by the batch's own)."""
    return [getattr(norm, name).clone() for norm in norms for name in STATISTICS]


@contextlib.contextmanager
def statistics_swapped(norms: list[nn.Module], spares: list[torch.Tensor]) -> Iterator[None]:
    """A recompute's BatchNorm: the same ops, on spare running statistics, so that the batch is not folded into
    the real ones (nor counted) a second time; the forward's update stands."""
    slots = [(norm, name) for norm in norms for name in STATISTICS]
    kept = [getattr(norm, name) for norm, name in slots]
    for (norm, name), spare in zip(slots, spares, strict=True):
        setattr(norm, name, spare)
    try:
        yield
    finally:
        for (norm, name), buffer in zip(slots, kept, strict=True):
            setattr(norm, name, buffer)


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


# What per-op checkpointing leaves out of its replay: the profiler's range markers and FSDP's parameter
# bookkeeping (all-gather, copy in/out), which carry no activation. FSDP runs them inside a block for a unit
# of its own there (a BatchNorm in float32 under --precision bf16: see fsdp.NORM_PRECISION), and not as many
# times in the recompute as in the forward (FSDP prefetches in backward), which the replay refuses ("invocation
# index N encountered during backward but not found in storage"). Left out, they just run each time.
UNREPLAYED_OPS = {
    torch.ops.profiler._record_function_enter.default,
    torch.ops.profiler._record_function_enter_new.default,
    torch.ops.profiler._record_function_exit.default,
    torch.ops.profiler._record_function_exit._RecordFunction,
}


def unreplayed_ops() -> set:
    ops = set(UNREPLAYED_OPS)
    if torch.distributed.is_available():  # registered by FSDP2's module (and c10d's), which a sharded run imports
        importlib.import_module("torch.distributed.fsdp._fully_shard._fsdp_collectives")  # defines torch.ops.fsdp
        ops |= {torch.ops.fsdp.all_gather_copy_in.default, torch.ops.fsdp.split_with_sizes_copy.default,
                torch.ops.fsdp.chunk_cat.default, torch.ops.fsdp.copy_.default, torch.ops.c10d._allgather_base_.default}
    return ops


def saving_ops() -> tuple:
    """A block's per-op policy, for torch.utils.checkpoint's context_fn (called at each forward)."""
    decision = torch.utils.checkpoint.CheckpointPolicy

    def policy(ctx, func, *args, **kwargs) -> decision:  # noqa: ANN001, ANN002, ANN003
        return decision.MUST_SAVE if func in SAVED_OPS else decision.PREFER_RECOMPUTE

    return torch.utils.checkpoint.create_selective_checkpoint_contexts(policy)
