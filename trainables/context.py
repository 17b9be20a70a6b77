"""What a worker is told about its place in the job. Built by whoever launched it (Ray, torchrun, a test)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    devices: tuple[torch.device, ...] = field(default_factory=lambda: (torch.device("cpu"),))

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank({self.rank}) must be in [0, world_size({self.world_size}))")
        if not self.devices:
            raise ValueError("a worker needs at least one device")

    @property
    def device(self) -> torch.device:
        """The device inputs go to and where data parallel keeps its buckets: the first owned device."""
        return self.devices[0]

    @property
    def distributed(self) -> bool:
        return self.world_size > 1 and dist.is_available() and dist.is_initialized()

    @property
    def grouped(self) -> bool:
        """A process group is formed (Ray Train forms one for a single worker too; a local run has none)."""
        return dist.is_available() and dist.is_initialized()

    @property
    def is_main(self) -> bool:
        return self.rank == 0


class Reporter(Protocol):
    """Where the loop sends what it measured. `log` is called on rank 0 only and must not block;
    `checkpoint` is called on every rank at the same step (rank 0 passes the folder, others None; with
    `finish`, the folder is still being written: finish() returns once it is complete, and the folder is then
    the reporter's to keep, the loop deleting it no more);
    `progress` on every rank after each step or validation batch (a heartbeat: it must be cheap; every rank
    passes the same steps, and only a training step moves the step on, so a reporter may run a collective
    where it does: validation batches, whose count may differ between ranks, repeat it);
    `preemption_notice` on every rank at each log point: whether the cluster said a node of this run is about
    to be reclaimed, or this process was told to stop (SIGTERM) (local and cheap; the loop agrees on it across
    ranks and checkpoints at once, with "preemption_notice" in every rank's metrics; that `checkpoint` ends the
    rank that was told, by raising, once the checkpoint is stored)."""

    def log(self, row: dict[str, float]) -> None: ...

    def progress(self, step: int) -> None: ...

    def checkpoint(self, metrics: dict[str, float], folder: str | None,
                   finish: Callable[[], None] | None = None) -> None: ...

    def preemption_notice(self) -> bool: ...
