"""Model parallel inside one worker: the model's layers cut into k stages, stage i on the worker's device
i (mod the devices it owns), micro-batches run through the stages in a GPipe wavefront, and the whole
multi-device module wrapped in DDP (device_ids=None) so gradients still average across workers.

The stages hold the model's own layer objects, and the model itself stays registered as `module`, so the
state_dict keeps the unsplit model's names: a checkpoint taken with k=2 loads with k=1, or without a pipeline.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from groundwork.errors import ConfigError
from trainables.config import TrainConfig
from trainables.context import DistContext
from trainables.data.meta import DataMeta
from trainables.models import build_model
from trainables.parallel.blocks import pipeline_layers


def layers_of(model: nn.Module) -> list[nn.Module]:
    layers = pipeline_layers(model)
    if layers is not None:
        return layers
    raise ConfigError(f"{type(model).__name__} cannot be split into stages: give it a pipeline_layers() method")


def balanced_split(weights: Sequence[int], k: int) -> list[int]:
    """Start index of each of k contiguous stages, minimising the largest stage's weight (parameters).

    Exact, by binary search on the bound with a greedy fill; every stage gets at least one layer."""
    if not 1 <= k <= len(weights):
        raise ConfigError(f"stages={k}: must be between 1 and the model's {len(weights)} layers")

    def starts_within(bound: int) -> list[int] | None:
        starts, total = [0], 0
        for i, w in enumerate(weights):
            # open a new stage when this one would overflow, or when the layers left are just enough
            if i > starts[-1] and (total + w > bound or len(weights) - i == k - len(starts)):
                if len(starts) == k:
                    return None
                starts.append(i)
                total = 0
            total += w
        return starts if len(starts) == k else None

    lo, hi = max(weights), sum(weights)
    while lo < hi:
        mid = (lo + hi) // 2
        if starts_within(mid) is None:
            lo = mid + 1
        else:
            hi = mid
    result = starts_within(lo)
    assert result is not None
    return result


def stage_devices(k: int, devices: Sequence[torch.device | str]) -> list[torch.device]:
    """Stage i runs on the worker's i-th device, wrapping when there are fewer devices than stages (on one
    GPU or on CPU every stage shares the device: the schedule is the same, only nothing overlaps)."""
    return [torch.device(devices[i % len(devices)]) for i in range(k)]


def check_split(starts: Sequence[int], n_layers: int, k: int) -> list[int]:
    starts = list(starts)
    if len(starts) != k or starts[0] != 0 or starts != sorted(set(starts)) or starts[-1] >= n_layers:
        raise ConfigError(f"split={starts}: need {k} increasing stage start indices from 0, each < {n_layers}")
    return starts


@dataclass(frozen=True)
class StageInfo:
    first_layer: int
    layers: int
    parameters: int
    device: str


class Pipeline(nn.Module):
    def __init__(self, model: nn.Module, devices: Sequence[torch.device | str], stages: int,
                 micro_batches: int, split: Sequence[int] | None = None) -> None:
        super().__init__()
        if micro_batches < 1:
            raise ConfigError(f"micro_batches={micro_batches}: must be at least 1")
        self.module = model  # registered: parameters and state_dict keep the unsplit model's names
        layers = layers_of(model)
        weights = [sum(p.numel() for p in layer.parameters()) for layer in layers]
        starts = check_split(split, len(layers), stages) if split else balanced_split(weights, stages)
        bounds = [*starts, len(layers)]
        self.devices = stage_devices(stages, devices)
        self.micro_batches = micro_batches
        spans = list(zip(itertools.pairwise(bounds), self.devices, strict=True))
        self._stages = [nn.Sequential(*layers[a:b]).to(d) for (a, b), d in spans]
        self.info = [StageInfo(a, b - a, sum(weights[a:b]), str(d)) for (a, b), d in spans]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """GPipe wavefront: at tick t stage s runs micro-batch t - s, so with one device per stage, stage s
        works on one micro-batch while stage s+1 works on the one before (CUDA queues run concurrently).
        Backward is autograd's, through the concatenated output."""
        chunks = list(x.chunk(self.micro_batches))
        acts: list[torch.Tensor | None] = [c.to(self.devices[0], non_blocking=True) for c in chunks]
        k, m = len(self._stages), len(chunks)
        for tick in range(m + k - 1):
            for s in range(k):  # stage s on micro-batch tick - s
                mb = tick - s
                if 0 <= mb < m:
                    inp = acts[mb].to(self.devices[s], non_blocking=True)
                    acts[mb] = self._stages[s](inp)
        return torch.cat(acts)  # (B, ...) on the last stage's device

    def compile_stages(self) -> None:
        self._stages = [torch.compile(stage) for stage in self._stages]


def pipeline_ddp(model: nn.Module, cfg: TrainConfig, ctx: DistContext) -> nn.Module:
    pipe = Pipeline(model, ctx.devices, cfg.stages or len(ctx.devices), cfg.micro_batches, cfg.split)
    if cfg.compile:
        pipe.compile_stages()
    # device_ids=None: the module spans several devices, so DDP must not pick one.
    return DistributedDataParallel(pipe, device_ids=None) if ctx.distributed else pipe


@dataclass(frozen=True)
class StageEstimate:
    info: StageInfo
    activation_bytes: int  # saved for backward, for all micro-batches of one batch (GPipe keeps them all)


def estimate_stages(model_name: str, meta: DataMeta, stages: int, micro_batches: int, batch_size: int,
                    split: Sequence[int] | None = None) -> list[StageEstimate]:
    """Per-stage layers, parameters and activation memory, from a forward on the meta device (no memory,
    no data): the tensors autograd saves for backward are counted as they are packed. fp32 sizes."""
    with torch.device("meta"):
        model = build_model(model_name, meta)
    pipe = Pipeline(model, ["meta"], stages, micro_batches, split)
    micro = max(1, batch_size // micro_batches)
    if meta.kind == "tokens":
        x = torch.zeros(micro, meta.seq_len, dtype=torch.long, device="meta")
    else:
        x = torch.zeros(micro, meta.in_channels, meta.image_size, meta.image_size, device="meta")
    out = []
    for stage, info in zip(pipe._stages, pipe.info, strict=True):
        saved = [0]

        def pack(t: torch.Tensor, saved: list[int] = saved) -> torch.Tensor:
            saved[0] += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            x = stage(x)
        out.append(StageEstimate(info, saved[0] * micro_batches))
    return out
