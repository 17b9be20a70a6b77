"""Run health the loop checks at each log point, with one small all-gather and no per-step host sync:
a non-finite loss (the first step it happened at, on any rank) and stragglers (ranks whose own work per
step, data wait + forward, is over `STRAGGLER_FACTOR` x the median; DDP's all-reduce makes every rank's wall
time the slowest one's, so the rank's own share is what tells them apart)."""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from groundwork.errors import NonFiniteLoss
from trainables.context import DistContext
from trainables.parallel.comm import AllReduceTimer
from trainables.telemetry import HostTelemetry, gpu_telemetry

STRAGGLER_FACTOR = 1.5
NO_BAD_STEP = -1.0


def stragglers(own_seconds: list[float], factor: float = STRAGGLER_FACTOR) -> list[int]:
    """Ranks whose own time per step exceeds factor x the median over all ranks."""
    if len(own_seconds) < 2:
        return []
    median = statistics.median(own_seconds)
    return [rank for rank, t in enumerate(own_seconds) if median > 0 and t > factor * median]


class RankClock:
    """Times this rank's own work (data wait + forward) per step, on the host for CPU and with CUDA events
    on GPU (read once per window, after the window's last step)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.host_s = 0.0
        self.events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.steps = 0
        self._t0 = 0.0

    def data_start(self) -> None:
        self._t0 = time.perf_counter()

    def forward_start(self) -> torch.cuda.Event | None:
        """On GPU the host part ends here and a CUDA event times the forward; on CPU the host clock runs on."""
        if not self.cuda:
            return None
        self.host_s += time.perf_counter() - self._t0
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def forward_end(self, started: torch.cuda.Event | None) -> None:
        if started is None:
            self.host_s += time.perf_counter() - self._t0
            return
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self.events.append((started, end))

    def per_step(self) -> float:
        """Seconds of own work per step since the last call; then starts a new window."""
        if self.events:
            self.events[-1][1].synchronize()
            self.host_s += sum(a.elapsed_time(b) for a, b in self.events) / 1e3
        out = self.host_s / max(self.steps, 1)
        self.host_s, self.events, self.steps = 0.0, [], 0
        return out


def spread(name: str, values: list[float]) -> dict[str, float]:
    """Mean and max of one figure across ranks, and the rank of the max."""
    top = max(range(len(values)), key=values.__getitem__)
    return {f"{name}_mean": statistics.fmean(values), f"{name}_max": values[top], f"{name}_max_rank": top}


class Health:
    """Per-rank health between log points: the first non-finite step (kept on the device), own time, and the
    telemetry figures (host, GPU, all-reduce) gathered into the row."""

    def __init__(self, ctx: DistContext, telemetry: bool = True, comm: AllReduceTimer | None = None) -> None:
        self.ctx = ctx
        self.clock = RankClock(ctx.device)
        self.host = HostTelemetry() if telemetry else None
        self.gpu = gpu_telemetry(ctx.device) if telemetry else None
        self.comm = comm if telemetry else None
        self.window_started = time.perf_counter()  # of the telemetry window the next row closes
        self.first_bad = torch.full((), NO_BAD_STEP, device=ctx.device, dtype=torch.float64)

    def watch_loss(self, loss: torch.Tensor, step: int) -> None:
        """Record `step` if the loss is not finite and none was recorded yet; no host sync."""
        bad = ~torch.isfinite(loss.to(self.first_bad.device)) & (self.first_bad < 0)
        self.first_bad = torch.where(bad, torch.full_like(self.first_bad, step), self.first_bad)

    def telemetry(self, steps: int) -> dict[str, float]:
        """This rank's figures for the window the row closes (the same names on every rank)."""
        figures: dict[str, float] = {}
        if self.host is not None:
            figures["cpu_pct"], figures["rss_mib"] = self.host.sample()
        if self.gpu is not None:
            figures.update(self.gpu.sample())
        now = time.perf_counter()
        if self.comm is not None:
            figures.update(self.comm.window(steps, now - self.window_started))
        self.window_started = now
        return figures

    def exchange(self, row: bool = True, notice: bool = False) -> dict[str, float | str]:
        """Called by every rank at the same step: raise on a non-finite loss; straggler and telemetry figures
        (each one's mean, max and the rank of the max; the GPUs' energy in all) for a row; with
        "preemption_notice" 1.0 where any rank had `notice` (a node about to be reclaimed).
        Not a `row`: the nan check alone, the telemetry windows run on to the next row."""
        steps = self.clock.steps
        figures = self.telemetry(steps) if row else {}
        mine = torch.tensor([self.clock.per_step(), *figures.values(), float(notice), 0.0], dtype=torch.float64,
                            device=self.ctx.device)
        mine[-1:] = self.first_bad.reshape(1)
        if self.ctx.distributed:
            gathered = [torch.empty_like(mine) for _ in range(self.ctx.world_size)]
            dist.all_gather(gathered, mine)
            table = torch.stack(gathered).cpu()  # (world, 1 + figures + 1): s/step, figures..., first bad
        else:
            table = mine.cpu().unsqueeze(0)
        bad = [int(s) for s in table[:, -1].tolist() if s >= 0]
        if bad:
            raise NonFiniteLoss(min(bad))
        own = table[:, 0].tolist()
        median = statistics.median(own)
        slowest = max(range(len(own)), key=own.__getitem__)
        out: dict[str, float | str] = {
            "slowest_rank": slowest, "slowest_rank_ratio": own[slowest] / median if median > 0 else 1.0,
            "stragglers": ",".join(map(str, stragglers(own)))}
        for column, name in enumerate(figures, start=1):
            out.update(spread(name, table[:, column].tolist()))
        if "gpu_energy_j" in figures:
            out["gpu_energy_j_total"] = table[:, 1 + list(figures).index("gpu_energy_j")].sum().item()
        if table[:, -2].max().item() > 0:
            out["preemption_notice"] = 1.0
        return out
