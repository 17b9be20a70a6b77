"""A pool: one warm group kept up on a running Ray cluster, for launches that join it (`--address`).

A launch on a worker group of its own spends most of its start in Ray Train's per-run processes (a
controller, then the workers, each a new Python importing torch, then the process group): ~12 s on a 2-core
machine before it loads any data, where torchrun starts its two workers in ~3 s. `orchestrator pool up` pays
that once: a detached keeper actor starts one warm group (orchestrator.warm.driver) and keeps it until `pool
down`. A launch that finds a pool of its own shape submits its job to the pool's desk (`submit`) and writes
the rows and checkpoints the group sends back into its run folder: the same files as a run on its own group,
so `--resume` works from either to either.

One job at a time: a second launch waits for the first. A launch of another shape (workers, resources,
placement, backend, env) starts its own group, as without a pool. Not on a pool: `--entry` functions and
the hang watchdog (a hung job holds the pool until `pool down`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import ray

from cluster.plan import Plan
from groundwork.errors import ConfigError, RunFailed
from orchestrator.raytrain.job import Job
from orchestrator.raytrain.session import join
from orchestrator.warm.client import OnReport, OnRow, serve

log = logging.getLogger(__name__)
NAMESPACE = "orchestrator-pool"  # every driver finds the pool here, whatever namespace it runs in
KEEPER, DESK_PREFIX = "keeper", "desk-"
DESK = f"{DESK_PREFIX}0"
POOL_DIR = ".pool"  # under the storage path; a run's name starts with a letter or digit, so never a run
READY_TIMEOUT_S = 600.0
WAIT_FOR_POOL_S = 24 * 3600.0  # a launch queues behind the pool's current job


@dataclass(frozen=True)
class GroupShape:
    """What a worker group is: a launch runs on the pool only if the pool's group has its shape."""

    workers: int
    resources_per_worker: dict[str, float]
    placement: str
    backend: str
    env: dict[str, str]

    @classmethod
    def of(cls, the_plan: Plan) -> GroupShape:
        return cls(the_plan.workers, the_plan.resources_per_worker, the_plan.placement_strategy,
                   the_plan.backend, the_plan.env)


@dataclass(frozen=True)
class PoolInfo:
    shape: GroupShape
    failed: str | None  # why the pool's group gave up, None while it serves
    log_dir: str


class PoolKeeper:
    """Holds the pool's warm group (its desk and its TorchTrainer, fit in a thread) for as long as the pool is
    up. Made a detached actor by `pool_up`."""

    def __init__(self, the_plan: Plan) -> None:
        from orchestrator.warm.driver import WarmGroups  # deferred: Ray Train (~1 s), which launches need not import

        folder = Path(the_plan.storage_path) / POOL_DIR / datetime.now().strftime("%Y%m%d-%H%M%S")
        self.shape = GroupShape.of(the_plan)
        # A job's own error may cost the group a restart (see orchestrator.warm.worker): the pool restarts forever.
        self.group = WarmGroups(the_plan, folder, 1, max_failures=-1, desk_prefix=DESK_PREFIX, namespace=NAMESPACE)
        self.group.__enter__()

    def describe(self) -> PoolInfo:
        return PoolInfo(self.shape, self.group.failures[0], str(self.group.log_dir(0)))

    def stop(self) -> None:
        """Close the desk: the group's workers return once their job (if any) is done, and the fit ends."""
        self.group.__exit__(None, None, None)


RemoteKeeper = ray.remote(num_cpus=0)(PoolKeeper)


def _keeper() -> ray.actor.ActorHandle | None:
    try:
        return ray.get_actor(KEEPER, namespace=NAMESPACE)
    except ValueError:
        return None


def pool_up(the_plan: Plan, address: str) -> tuple[PoolInfo, float]:
    """Start the pool on the cluster at `address` and wait for its workers; returns what it is and the wait."""
    started = time.perf_counter()
    join(address)
    try:
        if _keeper() is not None:
            raise ConfigError(f"a warm pool is already up at {address}: take it down first with"
                              f" `orchestrator pool down --address {address}`")
        keeper = RemoteKeeper.options(name=KEEPER, namespace=NAMESPACE, lifetime="detached").remote(the_plan)
        info = ray.get(keeper.describe.remote())
        answer = ray.get(ray.get_actor(DESK, namespace=NAMESPACE).ready.remote(READY_TIMEOUT_S))
        if answer is not True:
            _take_down(keeper)
            why = answer or f"its workers did not start within {READY_TIMEOUT_S:.0f} s"
            raise RunFailed(f"the warm pool did not start: {why} (logs: {info.log_dir})")
    finally:
        ray.shutdown()
    return info, time.perf_counter() - started


def pool_down(address: str) -> None:
    join(address)
    try:
        keeper = _keeper()
        if keeper is None:
            raise ConfigError(f"no warm pool is up at {address} (start one with `orchestrator pool up`)")
        _take_down(keeper)
    finally:
        ray.shutdown()


def _take_down(keeper: ray.actor.ActorHandle) -> None:
    with contextlib.suppress(ray.exceptions.RayActorError):
        ray.get(keeper.stop.remote(), timeout=150)
    ray.kill(keeper)  # and with it the desk and the trainer it owns


def find_pool(the_plan: Plan) -> bool:
    """Whether the cluster this driver joined has a pool this launch can run on."""
    keeper = _keeper()
    if keeper is None:
        return False
    info = ray.get(keeper.describe.remote())
    if info.failed:
        log.warning("the warm pool failed (%s): this launch starts its own workers", info.failed)
        return False
    if info.shape != GroupShape.of(the_plan):
        log.warning("the warm pool's workers (%s) do not fit this launch (%s): it starts its own, once the pool's"
                    " resources allow (`orchestrator pool down` frees them)", info.shape, GroupShape.of(the_plan))
        return False
    return True


def submit(job: Job, on_report: OnReport, on_row: OnRow) -> None:
    """Run `job` on the pool (after the job before it, if any); raises RunFailed if it fails."""
    serve([DESK], job, on_report, on_row, WAIT_FOR_POOL_S, NAMESPACE)
