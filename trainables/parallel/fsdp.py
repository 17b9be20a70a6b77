"""Sharded data parallel with PyTorch's FSDP2 (`fully_shard`): each worker holds 1/N of every parameter,
gradient and optimizer state (hsdp: 1/N of its shard group's, the groups replicas of each other); a block's
parameters are all-gathered just before it runs and freed after (`--reshard-after-forward`), gradients are
reduce-scattered in backward (and, under hsdp, all-reduced across the groups).

Each block of trainables.parallel.blocks is sharded on its own, then the root (which keeps the rest: GPT's
tied embedding and head), as torchtitan does.

Checkpoints stay in the one format every strategy reads: rank 0 writes the full (unsharded) model and
optimizer state, gathered with torch.distributed.checkpoint's state-dict API, so a run can resume under DDP,
FSDP or another world size."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from groundwork.errors import ConfigError
from trainables.config import TrainConfig
from trainables.context import DistContext
from trainables.parallel.blocks import batch_norms, blocks_of
from trainables.parallel.meta_init import meta_init

_PARAM_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}  # fp8: around the float8 matmuls
# BatchNorm's weights stay float32 under --precision bf16/fp16, as its running statistics are: the kernel
# takes low-precision inputs with float32 weights and statistics, not low-precision weights with float32
# statistics. FSDP1 does the same (MixedPrecision's _module_classes_to_ignore: each BatchNorm a unit of its
# own in full precision); its input is left as it comes, so its output keeps the precision of the layers around it.
NORM_PRECISION = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32, cast_forward_inputs=False)
FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)  # whole tensors, on rank 0's CPU
FROM_RANK0 = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)


def wrap_fsdp(model: nn.Module, cfg: TrainConfig, ctx: DistContext) -> nn.Module:
    """Shard `model` over all workers (one device each). The model comes as built, in host memory:
    fully_shard moves one block at a time to the worker's device and keeps only its shard there, so no GPU
    ever holds the whole model (moving it first would need the full fp32 model's memory on every GPU). With
    meta init (trainables.parallel.meta_init) only rank 0's came built; the others' shards get its weights."""
    if ctx.device.type == "cuda":
        torch.cuda.set_device(ctx.device)  # where fully_shard puts each block: the current device
    mesh = device_mesh(cfg, ctx)
    policy = MixedPrecisionPolicy(param_dtype=_PARAM_DTYPES.get(cfg.precision), reduce_dtype=torch.float32)
    offload: OffloadPolicy = CPUOffloadPolicy() if cfg.cpu_offload else OffloadPolicy()
    options: dict[str, Any] = {"mesh": mesh, "mp_policy": policy, "offload_policy": offload}
    from_rank0 = meta_init(cfg, ctx)
    full_state = model.state_dict() if from_rank0 and ctx.rank == 0 else None  # rank 0's weights, whole
    # inner units first: fully_shard leaves a submodule already sharded to its own unit
    norms = weighted_norms(model) if policy.param_dtype else []
    for norm in norms:
        fully_shard(norm, reshard_after_forward=cfg.reshard_after_forward,
                    **{**options, "mp_policy": NORM_PRECISION})
    for block in [b for b in blocks_of(model) if all(b is not norm for norm in norms)]:  # a unit once
        fully_shard(block, reshard_after_forward=cfg.reshard_after_forward, **options)
    fully_shard(model, reshard_after_forward=False, **options)  # the root's parameters are needed at once in backward
    if from_rank0:
        broadcast_weights(model, full_state, cfg, ctx)
    return model


def weighted_norms(model: nn.Module) -> list[nn.Module]:
    """The model's BatchNorm layers that have weights (see NORM_PRECISION)."""
    return [norm for norm in batch_norms(model) if any(True for _ in norm.parameters(recurse=False))]


def broadcast_weights(model: nn.Module, full_state: dict[str, torch.Tensor] | None, cfg: TrainConfig,
                      ctx: DistContext) -> None:
    """After fully_shard, on every rank: rank 0's weights (`full_state`, taken before sharding; None elsewhere)
    into each rank's shards, and its buffers (RoPE tables and the like, which no state dict holds) whole."""
    if ctx.rank != 0:  # storage for this rank's shards only (on the CPU where FSDP keeps them offloaded)
        model.to_empty(device=torch.device("cpu") if cfg.cpu_offload else ctx.device)
    with buffers_beside_shards(model):
        set_model_state_dict(model, full_state or {}, options=FROM_RANK0)
    for module, name, buffer in buffers_of(model):
        on_device = buffer.to(ctx.device)  # FSDP keeps buffers on the worker's device, offloaded or not
        dist.broadcast(on_device, src=0)
        setattr(module, name, on_device)


def buffers_of(model: nn.Module) -> list[tuple[nn.Module, str, torch.Tensor]]:
    return [(module, name, buffer)
            for module in model.modules() for name, buffer in module.named_buffers(recurse=False)]


@contextlib.contextmanager
def buffers_beside_shards(model: nn.Module) -> Iterator[None]:
    """The buffers on the device of the parameters' shards for the length of the block, then back where they
    were: loading a full state dict (set_model_state_dict) wants all of a model's tensors on one device, and
    under --cpu-offload FSDP keeps the shards on the CPU but the buffers (BatchNorm's statistics) on the GPU."""
    home = next((p.to_local().device if hasattr(p, "to_local") else p.device for p in model.parameters()), None)
    moved = [(module, name, buffer.device) for module, name, buffer in buffers_of(model)
             if home is not None and buffer.device != home]
    for module, name, _ in moved:
        setattr(module, name, getattr(module, name).to(home))
    try:
        yield
    finally:
        for module, name, device in moved:
            setattr(module, name, getattr(module, name).to(device))


def device_mesh(cfg: TrainConfig, ctx: DistContext) -> DeviceMesh:
    """fsdp: one dimension over all workers. hsdp: (replicate, shard), consecutive ranks in a shard group
    (Ray Train numbers the workers of a node consecutively), so parameters are gathered within a node and
    gradients all-reduced across nodes."""
    if cfg.strategy == "fsdp":
        return init_device_mesh(ctx.device.type, (ctx.world_size,))
    shard = cfg.shard_size or ctx.world_size
    if ctx.world_size % shard:
        raise ConfigError(f"hsdp: {ctx.world_size} workers do not divide into shard groups of {shard}:"
                          " set shard_size to a divisor of the workers")
    return init_device_mesh(ctx.device.type, (ctx.world_size // shard, shard), mesh_dim_names=("replicate", "shard"))


def no_gradient_sync(model: nn.Module) -> contextlib.AbstractContextManager:
    """FSDP's no_sync: the micro-batches under it keep their gradients unreduced (and unsharded)."""

    @contextlib.contextmanager
    def block() -> Iterator[None]:
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    return block()


def _param_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The fully qualified name of each parameter in the optimizer's order (its state's int keys)."""
    from trainables.parallel import unwrap  # deferred: as above

    names = {id(p): name for name, p in unwrap(model).named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """(model, optimizer) state, whole, as a plain model and optimizer's state_dict() would give them
    (optimizer state keyed by parameter index); on rank 0, empty on the others. Every rank must call it."""
    model_state = get_model_state_dict(model, options=FULL)
    optim = get_optimizer_state_dict(model, optimizer, options=FULL)
    index = {name: i for i, name in enumerate(_param_names(model, optimizer))}
    if not optim:
        return model_state, {}
    groups = [{**g, "params": [index[name] for name in g["params"]]} for g in optim["param_groups"]]
    return model_state, {"state": {index[name]: s for name, s in optim["state"].items()}, "param_groups": groups}


def load_full_state(model: nn.Module, optimizer: torch.optim.Optimizer, model_state: dict, optim: dict) -> None:
    """The inverse of full_state, on every rank from the same (whole) checkpoint: each keeps its shard."""
    with buffers_beside_shards(model):
        set_model_state_dict(model, model_state, options=StateDictOptions(full_state_dict=True))
    names = _param_names(model, optimizer)
    by_name = {"state": {names[i]: s for i, s in optim["state"].items()},
               "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in optim["param_groups"]]}
    set_optimizer_state_dict(model, optimizer, by_name, options=StateDictOptions(full_state_dict=True))
