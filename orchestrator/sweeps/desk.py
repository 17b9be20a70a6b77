"""The Desk: one small actor per warm worker group ("gang") through which a sweep's trials and the gang meet.

A trial claims a free desk, submits its job, and then reads the gang's reports, passing each to Tune and
acknowledging it. The gang's rank 0 takes the job, posts a report at every checkpoint and waits for the
verdict on it: "go" once the trial acknowledged it (Tune let the trial continue), "stop" once the trial let
go of the desk (Tune stopped or paused it) or stopped calling in (its actor was killed). Every call that
waits does so for at most `timeout` seconds and is simply repeated by its caller, so no thread of this
actor is held by a caller that died.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import ray

LEASE_S = 15.0  # a trial silent this long is gone (its actor was killed): its job is stopped, the desk freed
GO, STOP = "go", "stop"
GANG_FAILED = "the worker group failed in this job (Ray Train restarts it for the next one)"


@ray.remote(num_cpus=0, max_concurrency=16)
class Desk:
    def __init__(self, lease_s: float = LEASE_S) -> None:
        self.lease_s = lease_s
        self.cond = threading.Condition()
        self.trial: str | None = None  # the trial holding the desk
        self.seen = 0.0  # when that trial last called in
        self.seq = 0  # the number of the newest job
        self.job: dict[str, Any] | None = None  # the job in flight (submitted, not yet ended)
        self.handed = False  # the gang has taken the job in flight
        self.stopped = False  # the holder let go: stop the job in flight at its next report
        self.outbox: list[dict[str, Any]] = []  # reports and the job's end, for the trial to take
        self.reported = 0  # reports posted for the job in flight
        self.acked = -1  # the newest report the trial let through
        self.closed: str | None = None  # why no job will come any more ("" for the sweep's normal end)
        self.joined = False  # a gang has started and joined (ready for jobs)

    # --- the trial's side -------------------------------------------------------------------------------

    def claim(self, trial_id: str) -> bool | str:
        """True if this trial now holds the desk, False if it is busy, a message if it is closed."""
        with self.cond:
            if self.closed is not None:
                return self.closed or "the sweep is ending"
            if self.trial is not None and time.monotonic() - self.seen > self.lease_s:
                self._let_go()
            if self.trial not in (None, trial_id) or self.job is not None:
                return False
            self.trial, self.seen = trial_id, time.monotonic()
            return True

    def submit(self, trial_id: str, job: dict[str, Any]) -> int:
        with self.cond:
            if self.trial != trial_id or self.job is not None:
                raise RuntimeError(f"trial {trial_id} submitted to a desk it does not hold")
            self.seq += 1
            self.job = {**job, "seq": self.seq, "trial_id": trial_id}
            self.handed = self.stopped = False
            self.outbox, self.reported, self.acked = [], 0, -1
            self.cond.notify_all()
            return self.seq

    def take(self, trial_id: str, timeout: float) -> list[dict[str, Any]]:
        """The reports (and the job's end) not yet taken; waits up to `timeout` for one."""
        with self.cond:
            self._touch(trial_id)
            self.cond.wait_for(lambda: self.outbox or self.closed is not None, timeout)
            out, self.outbox = self.outbox, []
            if not out and self.closed and self.job is not None:
                out = [{"kind": "error", "message": self.closed}]
            return out

    def ack(self, trial_id: str, index: int) -> None:
        with self.cond:
            if self._touch(trial_id):
                self.acked = max(self.acked, index)
                self.cond.notify_all()

    def alive(self, trial_id: str) -> None:
        with self.cond:
            self._touch(trial_id)

    def release(self, trial_id: str) -> None:
        """The trial is over (finished, stopped or paused by Tune): stop its job if it still runs."""
        with self.cond:
            if self.trial == trial_id:
                self._let_go()

    # --- the gang's side (rank 0) -----------------------------------------------------------------------

    def join(self) -> None:
        """A gang (re)started: a job it had in flight died with its old workers."""
        with self.cond:
            self.joined = True
            if self.job is not None and self.handed:
                self._end("error", f"{GANG_FAILED}: a worker died (see the gang's logs)")
            self.cond.notify_all()

    def ready(self, timeout: float) -> bool | str:
        """True once a gang has joined, a message if the desk closed first, False if neither within `timeout`."""
        with self.cond:
            self.cond.wait_for(lambda: self.joined or self.closed is not None, timeout)
            if self.closed is not None:
                return self.closed or "closed"
            return self.joined

    def next_job(self, timeout: float) -> dict[str, Any] | None:
        """The job to run, {"closed": why} when the sweep is over, None when nothing came within `timeout`."""
        with self.cond:
            self.cond.wait_for(lambda: self.closed is not None or (self.job is not None and not self.handed),
                               timeout)
            if self.closed is not None:
                return {"closed": self.closed}
            if self.job is None or self.handed:
                return None
            self.handed = True
            return self.job

    def report(self, seq: int, metrics: dict[str, Any], path: str | None) -> int:
        with self.cond:
            index = self.reported
            if seq == self.seq and self.job is not None:
                self.outbox.append({"kind": "report", "index": index, "metrics": metrics, "path": path})
                self.reported += 1
                self.cond.notify_all()
            return index

    def row(self, seq: int, row: dict[str, float]) -> None:
        """A launch's metrics row (sweep trials send reports only)."""
        with self.cond:
            if seq == self.seq and self.job is not None:
                self.outbox.append({"kind": "row", "row": row})
                self.cond.notify_all()

    def verdict(self, seq: int, index: int, timeout: float) -> str | None:
        """GO, STOP, or None while the trial has not decided (ask again)."""
        with self.cond:
            self.cond.wait_for(lambda: self._verdict(seq, index) is not None, timeout)
            return self._verdict(seq, index)

    def end(self, seq: int, kind: str, message: str = "") -> None:
        """The gang left the job: "done", "stopped" or "error"."""
        with self.cond:
            if seq == self.seq and self.job is not None:
                self._end(kind, message)

    # --- the driver's side ------------------------------------------------------------------------------

    def close(self, why: str = "") -> None:
        """No more jobs: the gang's workers exit; a trial still waiting gets `why` as its error."""
        with self.cond:
            self.closed = why
            self.cond.notify_all()

    # --- helpers (called with the lock held) --------------------------------------------------------------

    def _touch(self, trial_id: str) -> bool:
        if self.trial == trial_id:
            self.seen = time.monotonic()
            return True
        return False

    def _let_go(self) -> None:
        self.trial = None
        self.stopped = True
        self.cond.notify_all()

    def _end(self, kind: str, message: str) -> None:
        self.outbox.append({"kind": kind, "message": message})
        self.job = None
        self.cond.notify_all()

    def _verdict(self, seq: int, index: int) -> str | None:
        if seq != self.seq or self.job is None or self.stopped or self.closed is not None:
            return STOP
        if time.monotonic() - self.seen > self.lease_s:
            return STOP
        return GO if self.acked >= index else None
