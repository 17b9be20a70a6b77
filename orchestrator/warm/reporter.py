"""The shared loop's reporter on a warm group: rows go to the desk, each checkpoint is staged for the job's
client and reported, and the group trains on while the client decides on it, as a Ray Train worker does
while Tune decides on its report. The verdict is looked for after each step (rank 0 asks the desk; one
small broadcast tells the other ranks, so every rank stops at the same step): a trial Tune stops loses the
steps it made meanwhile (~20 ms of them), a trial Tune lets go on no longer waits for it at every report.
At most one report is in flight: the next checkpoint waits for the verdict on the one before.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
import torch
import torch.distributed as dist

from orchestrator.warm.desk import GO, STOP, Assignment, Verdict
from trainables.checkpoint import move_checkpoint
from trainables.context import DistContext

POLL_S = 1.0  # how long one desk call waits; the other ranks wait in one broadcast no longer than this
_CODES: dict[Verdict | None, int] = {None: 0, GO: 1, STOP: 2}  # a verdict as one integer to broadcast
_VERDICTS = {code: verdict for verdict, code in _CODES.items()}


class Stopped(Exception):
    """The job's client let go (Tune stopped or paused the trial): leave the loop, take the next job."""


def agree(ctx: DistContext, ask: Callable[[], Any]) -> Any:
    """Rank 0 asks the desk and every rank gets the answer, repeated while it is None (nothing yet), so that
    no rank waits in a single collective for longer than one poll."""
    while True:
        box = [ask() if ctx.is_main else None]
        if ctx.distributed:
            dist.broadcast_object_list(box, src=0, device=ctx.device)
        if box[0] is not None:
            return box[0]


def share(ctx: DistContext, verdict: Verdict | None) -> Verdict | None:
    """Rank 0's verdict (None: not yet) on every rank, in one broadcast of one integer."""
    if not ctx.distributed:
        return verdict
    code = torch.tensor([_CODES[verdict] if ctx.is_main else 0], device=ctx.device)
    dist.broadcast(code, src=0)
    return _VERDICTS[int(code.item())]


class Awaited:
    """Rank 0's side of a report in flight: a desk call that returns the verdict, or None after POLL_S
    while the client has not decided (then asked again)."""

    def __init__(self, desk: Any, seq: int, index: int, path: str | None) -> None:
        self.desk, self.seq, self.index = desk, seq, index
        self.path = path  # the staged checkpoint, removed should the client not take it
        self.call = self._ask()

    def _ask(self) -> ray.ObjectRef:
        return self.desk.verdict.remote(self.seq, self.index, POLL_S)

    def verdict(self, block: bool) -> Verdict | None:
        if not block and not ray.wait([self.call], timeout=0)[0]:
            return None
        verdict = ray.get(self.call)
        if verdict is None:
            self.call = self._ask()
        return verdict


class GroupReporter:
    """See the module's docstring. Every rank calls `progress` with the same steps and `checkpoint` at the
    same step (the Reporter protocol), so every rank broadcasts at the same points."""

    def __init__(self, desk: Any, assignment: Assignment, ctx: DistContext) -> None:
        self.desk = desk
        self.seq = assignment.seq
        self.staging = assignment.job.staging
        self.ctx = ctx
        self.in_flight = False  # a report whose verdict has not come (every rank knows)
        self.awaited: Awaited | None = None  # rank 0's: how to learn that verdict
        self.looked_at = -1  # the step after which the verdict was last looked for (and the report's step)

    def log(self, row: dict[str, float]) -> None:
        self.desk.row.remote(self.seq, row)

    def progress(self, step: int) -> None:
        # A new step: training steps alone move it, on every rank alike (validation batches repeat it).
        if self.in_flight and step > self.looked_at:
            self.looked_at = step
            self._settle(block=False)

    def preemption_notice(self) -> bool:
        return False  # a trial's checkpoints are Tune's to schedule

    def checkpoint(self, metrics: dict[str, float], folder: str | None,
                   finish: Callable[[], None] | None = None) -> None:
        if finish is not None:
            finish()  # the client takes complete checkpoints (Tune copies them)
        if self.in_flight:
            try:
                self._settle(block=True)
            except Stopped:
                if folder:
                    shutil.rmtree(folder, ignore_errors=True)  # complete, and never staged: nobody will take it
                raise
        if self.ctx.is_main:
            # Moved where the client can read it: the loop's `folder` is gone (its delete finds nothing).
            path = str(move_checkpoint(folder, self.staging / Path(folder).name)) if folder else None
            index = ray.get(self.desk.report.remote(self.seq, metrics, path))
            self.awaited = Awaited(self.desk, self.seq, index, path)
        self.in_flight, self.looked_at = True, int(metrics.get("step", self.looked_at))

    def _settle(self, block: bool) -> None:
        """Learn the verdict on the report in flight (`block`: wait for it); STOP raises Stopped."""
        awaited = self.awaited
        if block:
            verdict = agree(self.ctx, lambda: awaited.verdict(block=True))
        else:
            verdict = share(self.ctx, awaited.verdict(block=False) if awaited is not None else None)
        if verdict is None:
            return
        self.in_flight, self.awaited = False, None
        if verdict != GO:
            if awaited is not None and awaited.path:
                shutil.rmtree(awaited.path, ignore_errors=True)  # the client will not take it
            raise Stopped
