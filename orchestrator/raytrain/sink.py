"""The MetricsSink: it carries rank 0's metric rows to the driver while training runs, and every rank's
heartbeat to the driver's watchdog. A plain class, made an actor where it is used
(`ray.remote(num_cpus=0)(MetricsSink)`), so its logic is tested in-process.

Rows come in fire-and-forget (`push.remote`) so logging never blocks a training step, and the driver polls
`since(n)` for the progress bar and writes them all to metrics.parquet at the end. It works across nodes,
where a file in a node-local run folder would not. Hang decisions use this actor's clock for every rank.
"""

from __future__ import annotations

import logging
import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray

from orchestrator.raytrain.stacks import dump_stacks
from orchestrator.raytrain.watchdog import Beat, Beats, find_hang

log = logging.getLogger(__name__)


def kill_worker(worker: bytes) -> None:
    """End a Ray Train worker actor (its pickled handle) for good: its group fails (or restarts, under
    --max-failures)."""
    ray.kill(pickle.loads(worker), no_restart=True)


@dataclass
class Hang:
    """What the sink found and did: the one-line finding, the rank it names, and every rank's stack (py-spy)
    read before the group was killed."""

    line: str
    rank: int
    stacks: dict[int, str]


def stacks_of(beats: dict[int, Beat]) -> dict[int, str]:
    """Every rank's stack, read on its own node (orchestrator.raytrain.stacks)."""
    return dump_stacks({rank: (beat.pid, beat.node) for rank, beat in beats.items()})


class MetricsSink:
    def __init__(self, kill: Callable[[Any], None] = kill_worker,
                 dump: Callable[[dict[int, Beat]], dict[int, str]] = stacks_of) -> None:
        self.rows: list[dict[str, float]] = []
        self.beats = Beats()
        self.workers: dict[int, Any] = {}  # rank -> its Ray Train worker actor (kill's argument)
        self.kill, self.dump = kill, dump
        self.starts = 0  # worker-group starts reported by rank 0 (see `started`)

    def started(self) -> int:
        """Rank 0 of a (re)started worker group calls in: how many restarts came before this start."""
        self.starts += 1
        return self.starts - 1

    def push(self, row: dict[str, float]) -> None:
        self.rows.append(row)

    def since(self, start: int) -> list[dict[str, float]]:
        return self.rows[start:]

    def register(self, rank: int, worker: Any) -> None:
        self.workers[rank] = worker

    def beat(self, rank: int, pid: int, node: str, step: int, ticks: int, done: bool) -> None:
        self.beats.add(rank, pid, node, step, ticks, done, time.monotonic())

    def heartbeats(self) -> dict[int, Beat]:
        return dict(self.beats.beats)

    def end_if_hung(self, timeout: float, now: float | None = None) -> Hang | None:
        """If a rank is hung, read every rank's stack, kill the worker group (fit() then fails, or restarts
        under --max-failures) and say why; None while every rank moves."""
        found = find_hang(self.beats.beats, time.monotonic() if now is None else now, timeout)
        if not found:
            return None
        hang = Hang(found, int(found.split()[1]), self.dump(dict(self.beats.beats)))  # "rank N (pid ..."
        for rank, worker in self.workers.items():
            try:
                self.kill(worker)
            except Exception as exc:  # the others still go; the group fails with them
                log.warning("rank %d could not be killed: %s", rank, exc)
        self.beats.clear()
        self.workers.clear()
        return hang
