"""The Desk: where one warm group and the clients that bring it jobs meet. A plain class; drivers make it an
actor (`ray.remote(num_cpus=0, max_concurrency=16)(Desk)`, see orchestrator.warm.driver and .pool), so its
protocol is tested in-process.

A client (a sweep trial, or a launch on a pool) claims a free desk, submits its Job, and then takes the
group's events: metric rows, reports (a checkpoint with its metrics) and finally how the job ended. It
acknowledges each report once it has passed it on. The group's rank 0 takes the job, posts a report at every
checkpoint and, training on, looks for the verdict on it (see orchestrator.warm.reporter): GO once the client
acknowledged it (for a sweep: Tune let the trial continue), STOP once the client let go of the desk (Tune
stopped or paused the trial) or stopped calling in (its process was killed). Every call that waits does so
for at most `timeout` seconds and is simply repeated by its caller, so no thread of the actor is held by a
caller that died.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from orchestrator.raytrain.job import Job

LEASE_S = 15.0  # a client silent this long is gone (its actor was killed): its job is stopped, the desk freed
GO, STOP = "go", "stop"
Verdict = Literal["go", "stop"]
GROUP_FAILED = "the worker group failed in this job (Ray Train restarts it for the next one)"


@dataclass(frozen=True)
class Assignment:
    """A job handed to the group: `seq` numbers the desk's jobs, so calls about an older one are ignored."""

    seq: int
    job: Job


@dataclass(frozen=True)
class Closed:
    """No job will come any more: the group's workers return. `why` is empty for a normal end."""

    why: str = ""


@dataclass(frozen=True)
class Row:
    """A metric row of the job (rank 0's `Reporter.log`)."""

    row: dict[str, float]


@dataclass(frozen=True)
class Report:
    """A checkpoint (a folder the client takes over, or None) with its metrics; acknowledged by `index`."""

    index: int
    metrics: dict[str, Any]
    path: str | None


@dataclass(frozen=True)
class Ended:
    """How the group left the job: done, stopped (its client let go), or error (`message` says why)."""

    how: Literal["done", "stopped", "error"]
    message: str = ""


Event = Row | Report | Ended


@dataclass
class _InFlight:
    """The job submitted and not yet ended, and where its events stand."""

    seq: int
    job: Job
    handed: bool = False  # the group has taken it
    reported: int = 0  # reports posted
    acked: int = -1  # the newest report the client let through
    outbox: list[Event] = field(default_factory=list)


class Desk:
    def __init__(self, lease_s: float = LEASE_S) -> None:
        self.lease_s = lease_s
        self.cond = threading.Condition()
        self.client: str | None = None  # the client holding the desk
        self.seen = 0.0  # when that client last called in
        self.seq = 0  # the number of the newest job
        self.job: _InFlight | None = None
        self.stopped = False  # the client let go: stop the job in flight at its next report
        self.outbox: list[Event] = []  # events for the client to take (outlive the job by one take)
        self.closed: str | None = None  # why no job will come any more ("" for the normal end)
        self.starts = 0  # times a group (re)started and joined

    # --- the client's side ------------------------------------------------------------------------------

    def claim(self, client: str) -> bool | str:
        """True if this client now holds the desk, False if it is busy, a message if it is closed."""
        with self.cond:
            if self.closed is not None:
                return self.closed or "the warm groups are shutting down"
            if self.client is not None and time.monotonic() - self.seen > self.lease_s:
                self._let_go()
            if self.client not in (None, client) or self.job is not None:
                return False
            self.client, self.seen = client, time.monotonic()
            return True

    def submit(self, client: str, job: Job) -> int:
        with self.cond:
            if self.client != client or self.job is not None:
                raise RuntimeError(f"client {client} submitted to a desk it does not hold")
            self.seq += 1
            self.job = _InFlight(self.seq, job)
            self.stopped = False
            self.outbox = []
            self.cond.notify_all()
            return self.seq

    def take(self, client: str, timeout: float) -> list[Event]:
        """The events not yet taken; waits up to `timeout` for one."""
        with self.cond:
            self._touch(client)
            self.cond.wait_for(lambda: self.outbox or self.closed is not None, timeout)
            out, self.outbox = self.outbox, []
            if not out and self.closed and self.job is not None:
                out = [Ended("error", self.closed)]
            return out

    def ack(self, client: str, index: int) -> None:
        with self.cond:
            if self._touch(client) and self.job is not None:
                self.job.acked = max(self.job.acked, index)
                self.cond.notify_all()

    def alive(self, client: str) -> None:
        with self.cond:
            self._touch(client)

    def release(self, client: str) -> None:
        """The client is done (finished, or Tune stopped or paused its trial): stop its job if it still runs."""
        with self.cond:
            if self.client == client:
                self._let_go()

    # --- the group's side (rank 0) ----------------------------------------------------------------------

    def join(self) -> None:
        """A group (re)started: a job it had in flight died with its old workers."""
        with self.cond:
            self.starts += 1
            if self.job is not None and self.job.handed:
                self._end(Ended("error", f"{GROUP_FAILED}: a worker died (see the group's logs)"))
            self.cond.notify_all()

    def ready(self, timeout: float) -> bool | str:
        """True once a group has joined, a message if the desk closed first, False if neither within `timeout`."""
        with self.cond:
            self.cond.wait_for(lambda: self.starts > 0 or self.closed is not None, timeout)
            if self.closed is not None:
                return self.closed or "closed"
            return self.starts > 0

    def next_job(self, timeout: float) -> Assignment | Closed | None:
        """The job to run, Closed when no more will come, None when nothing came within `timeout`."""
        with self.cond:
            self.cond.wait_for(lambda: self.closed is not None or (self.job is not None and not self.job.handed),
                               timeout)
            if self.closed is not None:
                return Closed(self.closed)
            if self.job is None or self.job.handed:
                return None
            self.job.handed = True
            return Assignment(self.job.seq, self.job.job)

    def report(self, seq: int, metrics: dict[str, Any], path: str | None) -> int:
        with self.cond:
            job = self._current(seq)
            if job is None:
                return -1
            index = job.reported
            self.outbox.append(Report(index, metrics, path))
            job.reported += 1
            self.cond.notify_all()
            return index

    def row(self, seq: int, row: dict[str, float]) -> None:
        with self.cond:
            if self._current(seq) is not None:
                self.outbox.append(Row(row))
                self.cond.notify_all()

    def verdict(self, seq: int, index: int, timeout: float) -> Verdict | None:
        """GO, STOP, or None while the client has not decided (ask again)."""
        with self.cond:
            self.cond.wait_for(lambda: self._verdict(seq, index) is not None, timeout)
            return self._verdict(seq, index)

    def end(self, seq: int, ended: Ended) -> None:
        """The group left the job."""
        with self.cond:
            if self._current(seq) is not None:
                self._end(ended)

    # --- the driver's side ------------------------------------------------------------------------------

    def times_started(self) -> int:
        """How many times a group started and joined: 1, plus one per restart."""
        with self.cond:
            return self.starts

    def close(self, why: str = "") -> None:
        """No more jobs: the group's workers return; a client still waiting gets `why` as its error."""
        with self.cond:
            self.closed = why
            self.cond.notify_all()

    # --- helpers (called with the lock held) --------------------------------------------------------------

    def _current(self, seq: int) -> _InFlight | None:
        return self.job if self.job is not None and self.job.seq == seq else None

    def _touch(self, client: str) -> bool:
        if self.client == client:
            self.seen = time.monotonic()
            return True
        return False

    def _let_go(self) -> None:
        self.client = None
        self.stopped = True
        self.cond.notify_all()

    def _end(self, ended: Ended) -> None:
        self.outbox.append(ended)
        self.job = None
        self.cond.notify_all()

    def _verdict(self, seq: int, index: int) -> Verdict | None:
        job = self._current(seq)
        if job is None or self.stopped or self.closed is not None:
            return STOP
        if time.monotonic() - self.seen > self.lease_s:
            return STOP
        return GO if job.acked >= index else None
