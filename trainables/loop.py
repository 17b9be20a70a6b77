"""The one training loop. It does not import Ray and does not know how it is distributed: it gets a model
(already wrapped by a strategy), an optimizer, loaders, a context (rank, devices) and a reporter.

Read it top to bottom: epochs -> optimizer steps -> micro-batches; every `log_every` steps one host sync to
log a row; a checkpoint every `checkpoint_every` steps and at the end of each epoch, after validation.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from trainables.checkpoint import rng_state, save_state
from trainables.config import TrainConfig
from trainables.context import DistContext, Reporter
from trainables.data.samplers import ResumableSampler
from trainables.flops import mfu, peak_flops
from trainables.health import Health
from trainables.objective import Objective, batch_to_device
from trainables.parallel import is_sharded, unwrap
from trainables.parallel.comm import AllReduceTimer
from trainables.precision import MixedPrecision
from trainables.profiling import StepProfiler

log = logging.getLogger(__name__)


@dataclass
class Position:
    """Where the run is: restored from a checkpoint, it resumes on the very next micro-batch."""

    epoch: int = 0
    batch_in_epoch: int = 0  # micro-batches this rank has consumed in `epoch`
    step: int = 0  # optimizer steps taken in all


@dataclass
class TrainState:
    model: nn.Module  # as wrapped by its strategy
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    amp: MixedPrecision
    objective: Objective  # how a batch becomes a loss
    # The strategy's way to accumulate gradients without syncing them (DDP's no_sync; nothing to skip else).
    no_sync: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    comm: AllReduceTimer | None = None  # the strategy's all-reduce timing, for telemetry
    position: Position = field(default_factory=Position)
    skipped_steps: int = 0  # steps skipped for non-finite gradients (--skip-nonfinite), this session

    sharded_dir: Path | None = None  # --checkpoint-format sharded: where every rank writes its shards (shared)
    checkpoint_group: Any = None  # --checkpoint-async: the process group of DCP's background writes (gloo)
    background_save: Any = None  # the sharded checkpoint DCP's thread is writing (a dcp.BackgroundSave)
    checkpointed_step: int = -1  # the step of this session's last checkpoint

    def wait_for_background_save(self) -> None:
        """Returns once the checkpoint being written in the background (if any) has this rank's shards on disk."""
        if self.background_save is not None:
            self.background_save.written()
            self.background_save = None

    def state_dict(self, cfg: TrainConfig) -> dict[str, Any]:
        """The whole state, in one format for every strategy: a sharded model's is gathered (every rank must
        call it then; rank 0 gets it)."""
        if is_sharded(self.model):
            from trainables.parallel.fsdp import full_state  # deferred: sharded runs only (see is_sharded)

            model, optimizer = full_state(self.model, self.optimizer)
        else:
            model, optimizer = unwrap(self.model).state_dict(), self.optimizer.state_dict()
        return {"model": model, "optimizer": optimizer, **self.rest_state(cfg)}

    def rest_state(self, cfg: TrainConfig) -> dict[str, Any]:
        """Everything but the model and optimizer: schedule, scaler, position in the data, RNG, config."""
        return {
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.amp.scaler.state_dict(),
            "position": asdict(self.position),
            "rng": rng_state(),
            "config": cfg.model_dump(),
        }


@dataclass
class Loaders:
    train: DataLoader
    val: DataLoader
    sampler: ResumableSampler
    tokens_per_sample: int = 0  # > 0 for language models: report tokens/s too


def steps_per_epoch(cfg: TrainConfig, loaders: Loaders) -> int:
    return (loaders.sampler.num_samples // cfg.batch_size) // cfg.grad_accum


def total_steps(cfg: TrainConfig, loaders: Loaders) -> int:
    steps = cfg.epochs * steps_per_epoch(cfg, loaders)
    return min(steps, cfg.max_steps) if cfg.max_steps else steps


def train_step(state: TrainState, batches: Any, cfg: TrainConfig, ctx: DistContext,
               health: Health) -> torch.Tensor:
    """One optimizer step over grad_accum micro-batches. Returns the mean loss, still on the device."""
    model, amp, clock = state.model, state.amp, health.clock
    total = torch.zeros((), device=ctx.device)
    for micro in range(cfg.grad_accum):
        clock.data_start()
        batch = batch_to_device(next(batches), ctx, cfg)
        # Only the last micro-batch syncs gradients: earlier ones accumulate locally.
        last = micro == cfg.grad_accum - 1
        with contextlib.nullcontext() if last else state.no_sync():
            forward = clock.forward_start()
            loss = state.objective.forward(model, batch, amp).loss
            clock.forward_end(forward)
            amp.scaler.scale(loss / cfg.grad_accum).backward()
        total += loss.detach().to(total.device)
        state.position.batch_in_epoch += 1
    clock.steps += 1
    if cfg.grad_clip or cfg.skip_nonfinite:
        amp.scaler.unscale_(state.optimizer)
        norm = nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip or float("inf"))
        # Gradients are all-reduced, so every rank sees the same norm and skips the same steps.
        if cfg.skip_nonfinite and not torch.isfinite(norm).item():
            state.skipped_steps += 1
            state.optimizer.zero_grad(set_to_none=True)  # no gradients: the optimizer leaves every weight be
    amp.scaler.step(state.optimizer)
    amp.scaler.update()
    state.optimizer.zero_grad(set_to_none=True)
    state.scheduler.step()
    state.position.step += 1
    return total / cfg.grad_accum


@torch.no_grad()
def evaluate(state: TrainState, loader: DataLoader, ctx: DistContext, cfg: TrainConfig,
             reporter: Reporter) -> dict[str, float]:
    """Loss (and, for cross-entropy, accuracy) over the whole validation split, each sample counted once
    across ranks."""
    state.model.eval()
    sums = torch.zeros(4, device=ctx.device, dtype=torch.float64)  # loss sum, correct, samples, with accuracy
    for batch in loader:
        reporter.progress(state.position.step)  # a long validation is progress, not a hang
        sums += state.objective.eval_sums(state.model, batch_to_device(batch, ctx, cfg), state.amp).to(sums.device)
    if ctx.distributed:
        dist.all_reduce(sums)
    state.model.train()
    out = {"val_loss": (sums[0] / sums[2]).item()}
    if sums[3] > 0:
        out["val_acc"] = (sums[1] / sums[3]).item()
    return out


def checkpoint(state: TrainState, cfg: TrainConfig, ctx: DistContext, reporter: Reporter,
               metrics: dict[str, float]) -> None:
    """Rank 0 writes the state to a fresh folder (sharded: every rank writes its shards into one on the shared
    storage, in the background with checkpoint_async); every rank reports (Ray's report is collective)."""
    notice = bool(metrics.get("preemption_notice"))  # this checkpoint ends the rank that was told
    # One checkpoint per step: a run that max_steps ends mid-epoch has just written this step's (checkpoint_every)
    # when the epoch-end one comes; that report carries its metrics only (under --checkpoint-async a second
    # write of the same step's folder would race with the first's completion).
    if not cfg.checkpoints or (state.position.step == state.checkpointed_step and not notice):
        reporter.checkpoint(metrics, None)
        return
    state.checkpointed_step = state.position.step
    finish = None  # the folder is being written: the reporter completes it with finish() and keeps it
    if state.sharded_dir is not None:
        background = cfg.checkpoint_async and not notice
        folder, finish = sharded_checkpoint(state, cfg, ctx, background)
    else:
        folder = tempfile.mkdtemp(prefix="ckpt-") if ctx.is_main else None
        whole = state.state_dict(cfg) if folder or is_sharded(state.model) else None  # gathering takes every rank
        if folder:
            save_state(whole, folder)
    try:
        reporter.checkpoint(metrics, folder, finish)
    finally:  # also when the reporter ends this rank (told to stop, see Reporter.preemption_notice)
        if folder and finish is None:
            shutil.rmtree(folder, ignore_errors=True)


def sharded_checkpoint(state: TrainState, cfg: TrainConfig, ctx: DistContext,
                       background: bool) -> tuple[str | None, Callable[[], None] | None]:
    """DCP's folder for this step, written by every rank: its path on rank 0 (None on the others), and, when
    written in the background, rank 0's way to wait for it and complete it (see dcp.BackgroundSave)."""
    from trainables.parallel.dcp import save_sharded, save_sharded_async  # deferred: sharded runs only

    assert state.sharded_dir is not None
    state.wait_for_background_save()  # one at a time: the last one's shards are on disk before these start
    partial = state.sharded_dir / f".partial-sharded-step{state.position.step}"
    folder = state.sharded_dir / f".sharded-step{state.position.step}"  # new: see prepare_sharded_checkpoints
    rest = state.rest_state(cfg) if ctx.is_main else None
    if background:
        state.background_save = save_sharded_async(state.model, state.optimizer, rest, partial, folder,
                                                   state.checkpoint_group)
        return (str(folder), state.background_save.finish) if ctx.is_main else (None, None)
    save_sharded(state.model, state.optimizer, rest, partial, folder)
    return (str(folder) if ctx.is_main else None), None


class Meter:
    """Loss and throughput between two log points, read with one host sync."""

    last_samples = 0  # samples trained in the window the last row closed

    def __init__(self, ctx: DistContext, samples_per_step: int, tokens_per_sample: int,
                 count_flops: Callable[[], float | None] | None = None, peak: float | None = None) -> None:
        self.loss = torch.zeros((), device=ctx.device)
        self.finite = torch.zeros((), device=ctx.device)  # steps with a finite loss (--skip-nonfinite skips others)
        self.steps = 0
        self.samples_per_step = samples_per_step
        self.tokens_per_sample = tokens_per_sample
        # FLOPs per sample, counted at the first row (once the first step is done: ~1 s the first time)
        self.count_flops, self.flops, self.peak, self.world_size = count_flops, None, peak, ctx.world_size
        self.since = time.perf_counter()
        self.aside: dict[str, float] = {}  # seconds of this window not spent training, by what took them

    @contextlib.contextmanager
    def set_aside(self, what: str) -> Iterator[None]:
        """Time that the window's throughput leaves out (validation, checkpoints), in the row as `what`."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.aside[what] = self.aside.get(what, 0.0) + time.perf_counter() - started

    def add(self, loss: torch.Tensor) -> None:
        finite = torch.isfinite(loss)
        self.loss += torch.where(finite, loss, 0.0)
        self.finite += finite
        self.steps += 1

    def row(self, state: TrainState, micro_per_epoch: int) -> dict[str, float]:
        loss = (self.loss / self.finite).item()  # the one host sync of the window; nan if every step was skipped
        elapsed = time.perf_counter() - self.since - sum(self.aside.values())  # training time alone
        pos = state.position
        row = {
            "step": pos.step,
            "epoch": pos.epoch + pos.batch_in_epoch / max(micro_per_epoch, 1),
            "loss": loss,
            "lr": state.optimizer.param_groups[0]["lr"],
            "samples_per_s": self.steps * self.samples_per_step / elapsed,
            "world_size": self.world_size,  # an elastic run's changes as it loses or gains workers
            **self.aside,
        }
        if self.tokens_per_sample:
            row["tokens_per_s"] = row["samples_per_s"] * self.tokens_per_sample
        if self.count_flops is not None and self.peak is not None:
            self.flops, self.count_flops = self.count_flops(), None
        row.update(mfu(self.flops, self.peak, row["samples_per_s"], self.world_size))
        self.last_samples = self.steps * self.samples_per_step
        self.loss.zero_()
        self.finite.zero_()
        self.steps = 0
        self.since = time.perf_counter()
        self.aside = {}
        return row

    def energy(self, figures: dict[str, float | str]) -> dict[str, float]:
        """The GPUs' energy per sample (and per token) over the window the last row closed."""
        joules = figures.get("gpu_energy_j_total")
        if not isinstance(joules, float) or not self.last_samples:
            return {}
        out = {"energy_j_per_sample": joules / self.last_samples}
        if self.tokens_per_sample:
            out["energy_j_per_token"] = out["energy_j_per_sample"] / self.tokens_per_sample
        return out


def train_loop(state: TrainState, loaders: Loaders, cfg: TrainConfig, ctx: DistContext,
               reporter: Reporter, profiler: StepProfiler | None = None,
               count_flops: Callable[[], float | None] | None = None) -> dict[str, float]:
    """Train to the config's end; `count_flops` (FLOPs per sample, see trainables.flops) puts MFU in the rows
    where the device's peak is known."""
    pos = state.position
    per_epoch = steps_per_epoch(cfg, loaders)
    last_step = total_steps(cfg, loaders)
    last_epoch = cfg.stop_after_epochs or cfg.epochs
    micro_per_epoch = per_epoch * cfg.grad_accum
    meter = Meter(ctx, cfg.batch_size * cfg.grad_accum * ctx.world_size, loaders.tokens_per_sample, count_flops,
                  peak_flops(cfg, ctx.device))
    health = Health(ctx, cfg.telemetry, state.comm)
    profiler = profiler or StepProfiler(None, None, False)
    metrics: dict[str, float] = {}
    train_seconds = 0.0  # this session's time in training steps, without validation and checkpoints
    first_step = True
    noticed = False  # a preemption notice was answered with a checkpoint (once: the restart comes next)
    state.model.train()
    while pos.epoch < last_epoch and pos.step < last_step:
        loaders.sampler.set_epoch(pos.epoch, start=pos.batch_in_epoch * cfg.batch_size)
        batches = iter(loaders.train)
        epoch_started = time.perf_counter()
        while pos.batch_in_epoch < micro_per_epoch and pos.step < last_step:
            profiler.before_step(pos.step + 1)
            loss = train_step(state, batches, cfg, ctx, health)
            profiler.after_step(pos.step)
            if first_step and ctx.is_main:
                log.info("first optimizer step done (step %d)", pos.step)  # bench/startup.py reads this line
            first_step = False
            meter.add(loss)
            if not cfg.skip_nonfinite:
                health.watch_loss(loss, pos.step)
            reporter.progress(pos.step)
            if pos.step % cfg.log_every == 0:
                checked = health.exchange(notice=reporter.preemption_notice())  # raises on a non-finite loss
                if ctx.is_main:
                    metrics = {**meter.row(state, micro_per_epoch), **checked, "skipped_steps": state.skipped_steps,
                               **meter.energy(checked)}
                    reporter.log(metrics)
                if checked.get("preemption_notice") and not noticed:  # a node is to be reclaimed: save now
                    noticed = True
                    if ctx.is_main:
                        log.warning("a node of this run is about to be reclaimed: checkpoint at step %d", pos.step)
                    with meter.set_aside("checkpoint_time_s"):  # every rank's metrics say why (see Reporter)
                        checkpoint(state, cfg, ctx, reporter, {**metrics, "step": pos.step, "preemption_notice": 1.0})
            if cfg.checkpoint_every and pos.step % cfg.checkpoint_every == 0 and pos.batch_in_epoch < micro_per_epoch:
                health.exchange(row=False)  # never checkpoint a nan
                with meter.set_aside("checkpoint_time_s"):
                    checkpoint(state, cfg, ctx, reporter, {**metrics, "step": pos.step})
        train_seconds += time.perf_counter() - epoch_started
        health.exchange(row=False)
        if pos.batch_in_epoch >= micro_per_epoch:
            pos.epoch, pos.batch_in_epoch = pos.epoch + 1, 0
        with meter.set_aside("val_time_s"):
            evaluated = evaluate(state, loaders.val, ctx, cfg, reporter)
        metrics = {**metrics, **evaluated, "step": pos.step, "epoch": pos.epoch, "train_time_s": train_seconds}
        if ctx.is_main:
            reporter.log(metrics)
        with meter.set_aside("checkpoint_time_s"):
            checkpoint(state, cfg, ctx, reporter, metrics)
    profiler.stop()  # a window past the last step ends with the run
    state.wait_for_background_save()  # before the process group goes (rank 0's reporter completes the folder)
    return metrics
