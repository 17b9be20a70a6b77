"""SIGTERM to a worker as a preemption notice. Kubernetes, SLURM and a spot VM's shutdown all send SIGTERM and
kill some seconds later; Ray's own handler exits at once, losing everything since the last checkpoint. Here
the signal only raises a flag: the shared loop sees it at its next log point (every rank, through the health
exchange), every rank writes a checkpoint, and the rank that was told then ends with `Preempted`. The
controller's failure policy charges that restart to Ray's preemption budget (unlimited), not --max-failures.

Signal handlers can only be set on a process's main thread: Ray Train runs the training function on a thread
of its own, so a worker callback sets the handler, from the actor's main thread, once the worker's context is
up, and gives SIGTERM back to Ray's handler when Ray shuts the worker down (Ray's own teardown of a group
sends SIGTERM too, and that one must end the process at once)."""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

from ray.train.v2._internal.execution.callback import WorkerCallback
from ray.train.v2._internal.execution.failure_handling import DefaultFailurePolicy
from ray.train.v2.api.exceptions import PreemptionError, WorkerGroupError
from ray.train.v2.api.preemption import PreemptionInfo

from groundwork.errors import Preempted

# Time from SIGTERM to the checkpoint that ends the rank before it exits as Ray would have at once: a rank stuck
# in a collective (another rank died) must not outlive the notice. Kubernetes' default grace is 30 s, a spot
# VM's warning two minutes; a sender that waits less kills the process first anyway.
GRACE_S = 60.0

log = logging.getLogger("orchestrator.worker")
_told = threading.Event()


def told() -> bool:
    """Whether this process got SIGTERM."""
    return _told.is_set()


def end_if_told(step: int) -> None:
    """After a checkpoint: the rank that got SIGTERM ends now (the others are stopped by the restart)."""
    if _told.is_set():
        raise Preempted(f"SIGTERM: this rank ended after its checkpoint at step {step}; the run restarts from it")


def listen_for_sigterm() -> Any:
    """On a worker's main thread: SIGTERM raises the flag instead of exiting; a second one, or no checkpoint
    within GRACE_S, exits as Ray's handler does. Returns Ray's handler."""
    ray_handler = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: Any) -> None:
        if _told.is_set():  # told twice, or the grace ran out: go as Ray would
            signal.signal(signal.SIGTERM, ray_handler)
            if callable(ray_handler):
                ray_handler(signum, frame)
            os._exit(128 + signum)
        _told.set()
        log.warning("SIGTERM: taken as a preemption notice: a checkpoint at the next log point, then this rank ends")
        timer = threading.Timer(GRACE_S, os.kill, (os.getpid(), signal.SIGTERM))
        timer.daemon = True
        timer.start()

    signal.signal(signal.SIGTERM, on_sigterm)
    return ray_handler


class ListenForSigterm(WorkerCallback):
    """Copied to every worker of each (re)started group; both hooks run on the actor's main thread."""

    def __init__(self) -> None:
        self.ray_handler: Any = None

    def after_init_train_context(self) -> None:
        self.ray_handler = listen_for_sigterm()

    def before_worker_shutdown(self) -> None:
        if self.ray_handler is not None:
            signal.signal(signal.SIGTERM, self.ray_handler)


def sigterm_ranks(error: Exception) -> list[int]:
    """The ranks of a failed worker group that ended with Preempted."""
    if not isinstance(error, WorkerGroupError):
        return []
    return sorted(rank for rank, failure in error.worker_failures.items()
                  if isinstance(getattr(failure, "cause", None) or failure, Preempted))


class SigtermIsPreemption(DefaultFailurePolicy):
    """Ray's failure policy, with a group whose rank ended on SIGTERM after its checkpoint charged as a
    preemption (FailureConfig.max_preemption_failures, unlimited by default) rather than a failure."""

    def make_decision(self, training_failed_error: Any) -> Any:
        ranks = sigterm_ranks(training_failed_error)
        if ranks:
            log.warning("rank(s) %s ended on SIGTERM after a checkpoint: restarting from it (not a failure)", ranks)
            training_failed_error = PreemptionError(PreemptionInfo(deadline_ms=None,
                                                                   preempted_node_to_ranks={"sigterm": ranks}))
        return super().make_decision(training_failed_error)
