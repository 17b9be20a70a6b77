"""Build a run from its config (data, model, strategy, optimizer), restore it if asked, and train.

This is the thin entry every launcher calls, torchtitan-style: parse -> build -> (restore) -> loop.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from groundwork.errors import ConfigError
from trainables.checkpoint import set_rng_state
from trainables.checks import dataset_of
from trainables.config import TrainConfig
from trainables.context import DistContext, Reporter
from trainables.data import DataMeta, build_datasets
from trainables.data.samplers import ResumableSampler, ShardSampler
from trainables.flops import flops_per_sample
from trainables.loop import Loaders, Position, TrainState, total_steps, train_loop
from trainables.models import build_model
from trainables.objective import objective_of
from trainables.parallel import is_sharded, parallelize, unwrap
from trainables.parallel.meta_init import building_device
from trainables.precision import mixed_precision
from trainables.profiling import StepProfiler

log = logging.getLogger(__name__)
# Validation keeps no activations for a backward pass: twice the training batch (Accelerate's examples use the
# same ratio) halves its per-batch overhead. Not for token data, where the whole batch's logits (tokens x
# vocabulary, in fp32 for the loss) can be the peak that activation checkpointing does not cut.
EVAL_BATCH_FACTOR = 2


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_loaders(cfg: TrainConfig, ctx: DistContext,
                  user: Mapping[str, Any] | None = None) -> tuple[Loaders, DataMeta]:
    train_ds, val_ds, meta = build_datasets(cfg, dataset_of(cfg), user or {})
    sampler = ResumableSampler(train_ds, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=cfg.seed)
    common = {
        "batch_size": cfg.batch_size,
        "num_workers": cfg.loader_workers,
        "pin_memory": ctx.device.type == "cuda",
        "persistent_workers": cfg.loader_workers > 0,
    }
    train = DataLoader(train_ds, sampler=sampler, drop_last=True, **common)
    eval_batch = cfg.batch_size * (1 if meta.kind == "tokens" else EVAL_BATCH_FACTOR)
    val = DataLoader(val_ds, sampler=ShardSampler(len(val_ds), ctx.rank, ctx.world_size),
                     **{**common, "batch_size": eval_batch})
    if len(train) < cfg.grad_accum:
        raise ConfigError(f"{len(train_ds)} training samples over {ctx.world_size} worker(s) at batch_size"
                         f" {cfg.batch_size} give {len(train)} batches, fewer than grad_accum {cfg.grad_accum}")
    return Loaders(train, val, sampler, tokens_per_sample=meta.seq_len), meta


def build_optimizer(cfg: TrainConfig, model: nn.Module, device: torch.device) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    # The fused kernel does the whole update in a few launches on CUDA; CPU takes the foreach path (and so do
    # FSDP's offloaded parameters, which live in CPU memory while the model runs on the GPU).
    on_gpu = device.type == "cuda" and all(p.device.type == "cuda" for p in params)
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, fused=on_gpu)


def lr_lambda(cfg: TrainConfig, steps: int):
    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.lr_schedule == "constant":
            return 1.0
        progress = (step - cfg.warmup_steps) / max(1, steps - cfg.warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return factor


def build_state(cfg: TrainConfig, ctx: DistContext, loaders: Loaders, meta: DataMeta,
                user: Mapping[str, Any]) -> TrainState:
    seed_everything(cfg.seed)  # same initial weights on every rank and every run
    with building_device(cfg, ctx):  # sharded: rank 0 alone builds it in memory (see parallel.meta_init)
        model = build_model(cfg.model, meta, cfg, user)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    wrapped = parallelize(model, cfg, ctx)
    optimizer = build_optimizer(cfg, wrapped.model, ctx.device)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg, total_steps(cfg, loaders)))
    return TrainState(wrapped.model, optimizer, scheduler, mixed_precision(cfg.precision, ctx.device),
                      objective_of(cfg), no_sync=wrapped.no_sync, comm=wrapped.comm)


def restore(state: TrainState, saved: dict[str, Any], cfg: TrainConfig) -> None:
    """Load a checkpoint of any strategy (they share one format); a sharded model keeps its own shards."""
    if saved.get("format") == "sharded":
        from trainables.parallel.dcp import load_sharded  # deferred: sharded checkpoints only (see is_sharded)

        load_sharded(state.model, state.optimizer, Path(saved["folder"]))
    elif is_sharded(state.model):
        from trainables.parallel.fsdp import load_full_state  # deferred: as above

        load_full_state(state.model, state.optimizer, saved["model"], saved["optimizer"])
    else:
        unwrap(state.model).load_state_dict(saved["model"])
        state.optimizer.load_state_dict(saved["optimizer"])
    state.scheduler.load_state_dict(saved["scheduler"])
    state.amp.scaler.load_state_dict(saved["scaler"])
    state.position = Position(**saved["position"])
    set_rng_state(saved["rng"])
    apply_hyperparameters(state, cfg)


def apply_hyperparameters(state: TrainState, cfg: TrainConfig) -> None:
    """The config's lr, weight decay and momentum win over the checkpoint's: the same values on a plain
    resume, new ones when a sweep (PBT) continues a trial from another trial's weights with mutated settings."""
    scheduler = state.scheduler
    scheduler.base_lrs = [cfg.lr] * len(state.optimizer.param_groups)
    for group, factor in zip(state.optimizer.param_groups, scheduler.lr_lambdas, strict=True):
        group["initial_lr"] = cfg.lr
        group["lr"] = cfg.lr * factor(scheduler.last_epoch)  # what LambdaLR would have set at this step
        group["weight_decay"] = cfg.weight_decay
        if "momentum" in group:
            group["momentum"] = cfg.momentum


def run_training(cfg: TrainConfig, ctx: DistContext, reporter: Reporter,
                 resume_from: dict[str, Any] | None = None, run_dir: str | Path | None = None,
                 user: Mapping[str, Any] | None = None) -> dict[str, float]:
    """Train `cfg` on this rank. `user` holds the user's own settings, for their model/dataset factories."""
    user = user or {}
    if cfg.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    loaders, meta = build_loaders(cfg, ctx, user)
    state = build_state(cfg, ctx, loaders, meta, user)
    if cfg.checkpoint_format == "sharded" and ctx.distributed and run_dir is not None:
        prepare_sharded_checkpoints(state, cfg, ctx, Path(run_dir))
    if resume_from is not None:
        restore(state, resume_from, cfg)
        log.info("resumed at epoch %d, step %d", state.position.epoch, state.position.step)
    else:
        seed_everything(cfg.seed + ctx.rank)  # per-rank stream for dropout and the like
    n_params = sum(p.numel() for p in unwrap(state.model).parameters())
    log.info("model %s: %.2fM parameters on %s", cfg.model, n_params / 1e6, [str(d) for d in ctx.devices])
    def count_flops() -> float | None:
        return flops_per_sample(lambda: build_model(cfg.model, meta, cfg, user), loaders.train.dataset,
                                state.objective)

    try:
        return train_loop(state, loaders, cfg, ctx, reporter, StepProfiler(cfg.profile_steps, run_dir, ctx.is_main),
                          count_flops if ctx.is_main and cfg.telemetry else None)  # the rows are rank 0's
    finally:
        if state.checkpoint_group is not None:  # a warm group's worker runs many jobs: one group each, ended
            with contextlib.suppress(Exception):  # a job that failed: its last write may have failed too
                state.wait_for_background_save()  # that write's collectives use the group
            dist.destroy_process_group(state.checkpoint_group)


def prepare_sharded_checkpoints(state: TrainState, cfg: TrainConfig, ctx: DistContext, run_dir: Path) -> None:
    """One folder every rank writes its shards to (else: the full format); for --checkpoint-async, the process
    group of DCP's background writes (gloo: one training does not use). Rank 0 removes what an earlier session
    left half-done there (a checkpoint cut short by a failure is never resumed from: it has no checkpoint_ name)."""
    state.sharded_dir = run_dir
    if cfg.checkpoint_async:
        state.checkpoint_group = dist.new_group(backend="gloo")
    if ctx.is_main:
        for leftover in [*run_dir.glob(".partial-sharded-step*"), *run_dir.glob(".sharded-step*")]:
            shutil.rmtree(leftover, ignore_errors=True)


