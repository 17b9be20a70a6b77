"""A job's side of a warm group: claim a free desk, submit the job, pass the group's rows and reports on
until the job ends, let go. Sweep trials (orchestrator.sweeps.trials) and launches on a pool
(orchestrator.launcher.on_pool) are clients; only what they do with a row or a report differs."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from typing import Any

import ray

from groundwork.errors import RunFailed
from orchestrator.raytrain.job import Job
from orchestrator.raytrain.periodic import Periodic
from orchestrator.warm.desk import Ended, Report, Row

POLL_S = 1.0  # how long one `take` waits for the group's next event
OnReport = Callable[[dict[str, Any], str | None], None]
OnRow = Callable[[dict[str, float]], None]


class KeepAlive(Periodic):
    """Tells the desk this client lives while it waits (e.g. on Tune); when the client's process is killed,
    the calls stop and the desk frees the group (see desk.LEASE_S)."""

    def __init__(self, desk: Any, client: str) -> None:
        super().__init__(1.0, "warm-keepalive")
        self.desk, self.client = desk, client

    def tick(self) -> None:
        self.desk.alive.remote(self.client)


def claim(desk_names: list[str], client: str, timeout_s: float, namespace: str | None = None) -> Any:
    """A free group's desk for this client. A sweep runs no more trials at once than it has groups, so one
    frees up as soon as the trial before it has left; a launch waits for the pool's job before it to end."""
    desks = [ray.get_actor(name, namespace=namespace) for name in desk_names]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for desk in desks:
            answer = ray.get(desk.claim.remote(client))
            if answer is True:
                return desk
            if isinstance(answer, str):
                raise RunFailed(f"the warm groups are gone: {answer}")
        time.sleep(0.05)
    raise RunFailed(f"no warm group came free within {timeout_s:.0f} s")


def relay(desk: Any, client: str, on_report: OnReport, on_row: OnRow | None) -> None:
    """Pass the group's rows and reports on until its job ends. Each report is acknowledged once `on_report`
    returns, which lets the group train on (for a sweep: once Tune let the trial continue)."""
    while True:
        for event in ray.get(desk.take.remote(client, POLL_S)):
            if isinstance(event, Row):
                if on_row is not None:
                    on_row(event.row)
            elif isinstance(event, Report):
                on_report(event.metrics, event.path)
                ray.get(desk.ack.remote(client, event.index))
            elif isinstance(event, Ended):
                if event.how == "done":
                    return
                raise RunFailed(event.message or f"the worker group ended the job ({event.how})")


def serve(desk_names: list[str], job: Job, on_report: OnReport, on_row: OnRow | None = None,
          claim_timeout_s: float = 600.0, namespace: str | None = None) -> None:
    """Run one job on a warm group: claim, submit, relay, let go. A job that fails raises RunFailed."""
    desk = claim(desk_names, job.name, claim_timeout_s, namespace)
    try:
        with KeepAlive(desk, job.name):
            ray.get(desk.submit.remote(job.name, job))
            relay(desk, job.name, on_report, on_row)
    finally:
        desk.release.remote(job.name)
        shutil.rmtree(job.staging, ignore_errors=True)  # reports nobody took
