"""Hang detection: every rank beats to the run's MetricsSink about once a second (pid, node, last step, and
a counter that moves on every step or validation batch); the driver asks the sink every second whether a rank
has stopped. The decision is a pure function of the beats, tested without Ray.

A rank is hung when its counter has not moved for `hang_timeout` seconds (by the sink's clock, so node clocks
do not matter). A rank whose beats stopped too is named first: its process is frozen or gone (SIGSTOP, a
stuck driver call holding the GIL), and the ranks waiting for it in a collective are its victims.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from orchestrator.raytrain.periodic import Periodic
from orchestrator.raytrain.stacks import innermost

BEAT_EVERY_S = 0.5


@dataclass
class Beat:
    """What the sink knows of one rank: times are the sink's own clock."""

    rank: int
    pid: int
    node: str
    step: int
    ticks: int
    seen_at: float  # last beat received
    moved_at: float  # last time `ticks` changed
    done: bool = False


def find_hang(beats: dict[int, Beat], now: float, timeout: float) -> str | None:
    """A one-line description of the hang, or None. Silent ranks (no beats) first, then the lowest step."""
    stuck = [b for b in beats.values() if not b.done and now - b.moved_at > timeout]
    if not stuck:
        return None
    silent = [b for b in stuck if now - b.seen_at > timeout]
    if silent:
        culprit = min(silent, key=lambda b: (b.seen_at, b.rank))
        return (f"rank {culprit.rank} (pid {culprit.pid}, node {culprit.node[:12]}) stopped responding after step"
                f" {culprit.step}: no heartbeat for {now - culprit.seen_at:.0f} s (--hang-timeout {timeout:g})")
    # Once one rank has waited past the timeout, the one it waits for is the rank furthest behind, whether or
    # not that one's own clock has run out yet (they stopped together, within milliseconds).
    culprit = min((b for b in beats.values() if not b.done), key=lambda b: (b.step, b.moved_at, b.rank))
    others = ", ".join(f"rank {b.rank} at step {b.step}" for b in sorted(beats.values(), key=lambda b: b.rank)
                       if b.rank != culprit.rank)
    return (f"rank {culprit.rank} (pid {culprit.pid}, node {culprit.node[:12]}) made no progress after step"
            f" {culprit.step} for {now - culprit.moved_at:.0f} s (--hang-timeout {timeout:g})"
            + (f"; {others}" if others else ""))


class Beats:
    """The sink's side: fold incoming beats into Beat records (used inside the MetricsSink actor)."""

    def __init__(self) -> None:
        self.beats: dict[int, Beat] = {}

    def add(self, rank: int, pid: int, node: str, step: int, ticks: int, done: bool, now: float) -> None:
        old = self.beats.get(rank)
        if old is None or old.pid != pid or old.ticks != ticks:
            self.beats[rank] = Beat(rank, pid, node, step, ticks, now, now, done)  # new process, or it moved
        else:
            old.seen_at, old.done = now, done

    def clear(self) -> None:
        self.beats.clear()


class Heartbeat(Periodic):
    """The worker's side: a daemon thread that sends this rank's progress to the sink every BEAT_EVERY_S.
    `tick_step` is what the training loop calls: two attribute writes, no Ray call on the training thread."""

    def __init__(self, sink: Any, rank: int, node: str, worker: Any) -> None:
        super().__init__(BEAT_EVERY_S, "orchestrator-heartbeat")
        self.sink, self.rank, self.node, self.worker = sink, rank, node, worker
        self.step = 0
        self.ticks = 0

    def tick_step(self, step: int) -> None:
        self.step = step
        self.ticks += 1

    def tick(self, done: bool = False) -> None:
        self.sink.beat.remote(self.rank, os.getpid(), self.node, self.step, self.ticks, done)

    def __enter__(self) -> Heartbeat:
        self.sink.register.remote(self.rank, self.worker)
        self.tick()
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self.tick(done=True)


class Watchdog(Periodic):
    """The driver's side: asks the sink once a second; the sink ends a hung worker group and says why. Each
    rank's stack, read before the end, goes to `stacks_dir`/rank-N.txt, and the line says where the rank it
    names is stuck (e.g. in an all_reduce)."""

    def __init__(self, sink: Any, timeout: float, stacks_dir: Path | None = None, every_s: float = 1.0) -> None:
        super().__init__(every_s, "orchestrator-watchdog")
        self.sink, self.timeout, self.stacks_dir = sink, timeout, stacks_dir
        self.hangs: list[str] = []

    def tick(self) -> None:
        hang = ray.get(self.sink.end_if_hung.remote(self.timeout))
        if hang:
            self.hangs.append(hang.line + self.keep_stacks(hang.rank, hang.stacks))

    def keep_stacks(self, rank: int, stacks: dict[int, str]) -> str:
        """Write the stacks; the words the hang line gains from them."""
        if self.stacks_dir is None or not stacks:
            return ""
        where = innermost(stacks.get(rank, ""))
        said = f"; rank {rank} is in {where}" if where else ""
        try:
            self.stacks_dir.mkdir(parents=True, exist_ok=True)
            for r, text in stacks.items():
                (self.stacks_dir / f"rank-{r}.txt").write_text(text)
        except OSError as exc:  # a full or read-only storage: the finding still ends the run
            return f"{said}; stacks not kept ({exc.strerror})"
        return f"{said}; stacks in {self.stacks_dir}"
