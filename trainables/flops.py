"""Model FLOPs per sample and the GPU's peak, for MFU (model FLOPs utilisation) in every row.

FLOPs are counted, not estimated from a formula, so they hold for every built-in model and for a user's own:
PyTorch's FlopCounterMode runs one forward and backward of a two-sample batch through a copy of the model
built on the meta device (no memory, no arithmetic, the global RNG untouched: a resumed run stays bit-exact).
Peak: `--peak-tflops`, else NVIDIA's dense tensor-core figure for the cluster spec's `gpus.type` (put in
`peak_tflops` by the launch) or the GPU's own name (bf16/fp16, or TF32 for fp32), else none (CPU): then no
MFU column."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, default_collate
from torch.utils.flop_counter import FlopCounterMode

from trainables.config import TrainConfig
from trainables.objective import Objective, is_pair, moved
from trainables.peaks import peak_tflops_of
from trainables.precision import mixed_precision

log = logging.getLogger(__name__)

def peak_flops(cfg: TrainConfig, device: torch.device) -> float | None:
    """One device's peak FLOP/s for this run's precision, or None where it is not known."""
    if cfg.peak_tflops:
        return cfg.peak_tflops * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    found = peak_tflops_of(name, cfg.precision)
    if found is None:
        log.info("no peak FLOP/s known for %s: pass --peak-tflops for MFU", name)
        return None
    return found * 1e12


SAMPLES = 2  # batch norm in training mode needs more than one value per channel


def samples_on_meta(dataset: Dataset) -> Any:
    """The dataset's first samples as a batch, on the meta device (images as floats, as to_device makes
    them)."""
    batch = default_collate([dataset[i % len(dataset)] for i in range(SAMPLES)])
    if is_pair(batch) and isinstance(batch[0], torch.Tensor) and batch[0].dtype == torch.uint8:
        batch = (batch[0].float(), batch[1])
    return moved(batch, torch.device("meta"))


def flops_per_sample(build: Callable[[], nn.Module], dataset: Dataset, objective: Objective) -> float | None:
    """Forward + backward FLOPs of one training sample, or None if the model cannot run on the meta device."""
    # Eager throughout: the training's compiled loss must not see (and recompile for) these meta tensors.
    eager = dataclasses.replace(objective, compile=False)
    try:
        with torch.random.fork_rng(devices=[]), torch.compiler.set_stance("force_eager"), torch.device("meta"):
            model = build()
            counter = FlopCounterMode(display=False)
            with counter:
                fp32 = mixed_precision("fp32", torch.device("cpu"))  # FLOPs are FLOPs in any precision
                eager.forward(model, samples_on_meta(dataset), fp32).loss.backward()
        return counter.get_total_flops() / SAMPLES or None
    except Exception as exc:  # a model or data that the meta device cannot run: no MFU, training goes on
        log.info("FLOPs not counted (%s: %s): no MFU column", type(exc).__name__, str(exc)[:200])
        return None


def mfu(flops: float | None, peak: float | None, samples_per_s: float, world_size: int) -> dict[str, float]:
    """The row's `mfu` (of all devices' peak) and `model_tflops` per device, where both are known."""
    if not flops or not peak:
        return {}
    per_device = flops * samples_per_s / world_size
    return {"mfu": per_device / peak, "model_tflops": per_device / 1e12}

