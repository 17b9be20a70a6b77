"""How long a DDP rank spends in gradient all-reduce, timed by a DDP communication hook around PyTorch's own
all-reduce hook (the same averaging DDP does without a hook).

Each bucket's all-reduce is an interval from the moment its gradients are ready (the hook is called in
backward) to the moment the reduced bucket is back: host clocks on CPU (gloo completes the future on its
own thread), CUDA events on GPU (the start on the stream that produced the gradients, the end in the
future's callback, which runs on a stream that waits for NCCL's). Buckets overlap one another and the
backward pass, so the busy time is the union of the intervals, not their sum; its share of the window's
wall time is what the rows report. The time includes waiting for the slowest rank's gradients, as a profiler
trace of the same step would show."""

# No `from __future__ import annotations`: DDP checks the hook's annotations against the real classes.
import threading
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

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
    """A comm hook that all-reduces as DDP would and records when each bucket started and finished."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.lock = threading.Lock()  # gloo runs the callbacks on its own threads
        self.spans: list[tuple[Mark, Mark]] = []
        self.bytes = 0
        self.since = time.perf_counter()

    def mark(self) -> Mark:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def hook(self, process_group: dist.ProcessGroup | None,
             bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        start = self.mark()
        buffer = bucket.buffer()
        self.bytes += buffer.numel() * buffer.element_size()

        def done(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            end = self.mark()
            with self.lock:
                self.spans.append((start, end))
            return fut.value()

        return allreduce_hook(process_group, bucket).then(done)

    def window(self, steps: int) -> dict[str, float]:
        """All-reduce figures since the last call: busy ms and MiB per step, and the share of wall time.
        Called at a log point, after the window's last step has been waited for."""
        wall = time.perf_counter() - self.since
        with self.lock:
            spans, self.spans = self.spans, []
        sent, self.bytes = self.bytes, 0
        self.since = time.perf_counter()
        busy = busy_seconds(self.seconds(spans))
        per_step = max(steps, 1)
        return {"allreduce_ms_per_step": 1e3 * busy / per_step, "allreduce_mib_per_step": sent / 2**20 / per_step,
                "allreduce_share": busy / wall if wall > 0 else 0.0}

    def seconds(self, spans: list[tuple[Any, Any]]) -> list[tuple[float, float]]:
        if not self.cuda or not spans:
            return spans
        spans[-1][1].synchronize()  # the loss read at the log point waited for compute, not for NCCL's stream
        origin = spans[0][0]
        return [(origin.elapsed_time(a) / 1e3, origin.elapsed_time(b) / 1e3) for a, b in spans]


def time_allreduce(model: DistributedDataParallel) -> AllReduceTimer:
    """Register the timing hook on a DDP model (before its first step) and return the timer."""
    timer = AllReduceTimer(cuda=next(model.parameters()).is_cuda)
    model.register_comm_hook(None, timer.hook)
    return timer
