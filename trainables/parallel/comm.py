"""How long a DDP rank spends in gradient all-reduce, timed by a DDP communication hook around PyTorch's own
all-reduce hook (the same averaging DDP does without a hook), or its compressing one (--grad-compression).

Each bucket's all-reduce is an interval from the moment its gradients are ready (the hook is called in
backward) to the moment the reduced bucket is back: host clocks on CPU (gloo completes the future on its
own thread), CUDA events on GPU (the start on the stream that produced the gradients, the end in the
future's callback, which runs on a stream that waits for NCCL's). Buckets overlap one another and the
backward pass, so the busy time is the union of the intervals, not their sum; its share of the step's wall
time is what the rows report. The time includes waiting for the slowest rank's gradients, as a profiler
trace of the same step would show.

Only one step in `every` (the log interval) is timed: timing every bucket of every step cost GPT-2 124M 2.8%
of its steps/s on an H200, one step in 10 0.6%, PyTorch's own hook alone 0.3% (bench/results/comm_gpu_h200.json)."""

# No `from __future__ import annotations`: DDP checks the hook's annotations against the real classes.
import threading
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from trainables.config import TrainConfig
from trainables.parallel.compression import Compression

Mark = float | torch.cuda.Event


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end] intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


class AllReduceTimer:
    """A comm hook that all-reduces as `compression` says and records when each bucket started and finished,
    and the bytes it sent."""

    def __init__(self, cuda: bool, compression: Compression, every: int = 1) -> None:
        self.cuda, self.compression, self.every = cuda, compression, every
        self.lock = threading.Lock()  # gloo runs the callbacks on its own threads
        self.spans: list[tuple[Mark, Mark]] = []
        self.bytes = 0
        self.steps = 0  # steps whose gradients went through the hook (the micro-batches under no_sync do not)
        self.timed = 0  # of them, timed since the last window
        self.last: dict[str, float] = {"allreduce_ms_per_step": 0.0, "allreduce_share": 0.0}

    def mark(self) -> Mark:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def hook(self, process_group: dist.ProcessGroup | None,
             bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        timing = self.steps % self.every == self.every - 1  # the same answer for every bucket of the step
        if bucket.is_last():
            self.steps += 1
            self.timed += timing
        start = self.mark() if timing else None
        future, sent = self.compression(bucket)
        self.bytes += sent
        if start is None:
            return future

        def done(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            end = self.mark()
            with self.lock:
                self.spans.append((start, end))
            return fut.value()

        return future.then(done)

    def window(self, steps: int, wall_s: float) -> dict[str, float]:
        """All-reduce figures for a window of `steps` steps and `wall_s` seconds: busy ms per timed step, its
        share of a step's wall time, MiB all-reduced per step. A window without a timed step repeats the last.
        Called at a log point, after the window's last step has been waited for."""
        with self.lock:
            spans, self.spans = self.spans, []
        sent, timed, self.bytes, self.timed = self.bytes, self.timed, 0, 0
        if timed and spans and steps and wall_s > 0:
            ms = 1e3 * busy_seconds(self.seconds(spans)) / timed
            self.last = {"allreduce_ms_per_step": ms, "allreduce_share": min(1.0, ms / 1e3 / (wall_s / steps))}
        return {**self.last, "allreduce_mib_per_step": sent / 2**20 / max(steps, 1)}

    def seconds(self, spans: list[tuple[Any, Any]]) -> list[tuple[float, float]]:
        if not self.cuda or not spans:
            return spans
        spans[-1][1].synchronize()  # the loss read at the log point waited for compute, not for NCCL's stream
        origin = spans[0][0]
        return [(origin.elapsed_time(a) / 1e3, origin.elapsed_time(b) / 1e3) for a, b in spans]


def register_comm(model: DistributedDataParallel, cfg: TrainConfig) -> AllReduceTimer | None:
    """The all-reduce the config asks for (compressed or not) on a DDP model, before its first step: timed
    (one step per log interval) with telemetry on, PyTorch's own hook alone with it off."""
    compression = Compression(cfg)
    if cfg.telemetry:
        timer = AllReduceTimer(next(model.parameters()).is_cuda, compression, every=cfg.log_every)
        model.register_comm_hook(None, timer.hook)
        return timer
    if compression.kind != "none":
        model.register_comm_hook(compression.state, compression.hook)
    return None
