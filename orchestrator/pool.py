"""A warm pool: one worker group kept up on a running Ray cluster, for launches that join it (`--address`).

A launch on a worker group of its own spends most of its start in Ray Train's per-run processes (a
controller, then the workers, each a new Python importing torch, then the process group): ~12 s on a 2-core
machine before it loads any data, where torchrun starts its two workers in ~3 s. `orchestrator pool up`
pays that once: a detached keeper actor runs a TorchTrainer whose workers wait at a desk for jobs, the warm
worker groups ("gangs") that sweeps run their trials on. A launch that finds a pool of its own shape hands
the desk its training settings and writes the rows and checkpoints the gang sends back into its run folder:
the same files as a run on its own group, so `--resume` works from either to either.

One job at a time: a second launch waits for the first. A launch of another shape (workers, resources,
placement, backend, env) starts its own group, as without a pool. Not on a pool: `--entry` functions and
the hang watchdog (a hung job holds the pool until `pool down`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import ray

from cluster.plan import Plan
from orchestrator.config import LaunchConfig
from orchestrator.sweeps.desk import Desk
from orchestrator.sweeps.gangs import JobFailed, gang_worker, serve
from trainables.checkpoint import checkpoints_in
from trainables.errors import ConfigError, RunFailed

log = logging.getLogger(__name__)
NAMESPACE = "orchestrator-pool"  # every driver finds the pool here, whatever namespace it runs in
KEEPER, DESK = "keeper", "desk"
POOL_DIR = ".pool"  # under the storage path; a run's name starts with a letter or digit, so never a run
READY_TIMEOUT_S = 600.0
WAIT_FOR_POOL_S = 24 * 3600.0  # a launch queues behind the pool's current job


def shape(the_plan: Plan) -> dict[str, Any]:
    """What a worker group is: a launch runs on the pool only if the pool's group has its shape."""
    return {"workers": the_plan.workers, "resources per worker": the_plan.resources_per_worker,
            "placement": the_plan.placement_strategy, "backend": the_plan.backend, "env": the_plan.env}


@ray.remote(num_cpus=0)
class PoolKeeper:
    """Holds the pool's desk and runs its TorchTrainer in a thread, for as long as the pool is up."""

    def __init__(self, cfg: LaunchConfig, the_plan: Plan) -> None:
        from orchestrator.launcher import make_trainer

        self.shape = shape(the_plan)
        self.dir = Path(the_plan.storage_path) / POOL_DIR / datetime.now().strftime("%Y%m%d-%H%M%S")
        self.failed: str | None = None
        self.desk = Desk.options(name=DESK, namespace=NAMESPACE).remote()
        # A job's own error may cost the gang a restart (see gangs.gang_worker): the pool restarts forever.
        run = cfg.model_copy(update={"max_failures": -1})
        self.trainer = make_trainer(run, the_plan, self.dir, sink=None, worker=gang_worker,
                                    extra={"desk": DESK, "desk_namespace": NAMESPACE})
        self.thread = threading.Thread(target=self._fit, name="pool", daemon=True)
        self.thread.start()

    def _fit(self) -> None:
        from orchestrator.launcher import failure_line

        try:
            self.trainer.fit()
        except Exception as exc:
            self.failed = failure_line(exc, [], self.dir)
            log.error("the warm pool failed: %s", self.failed)
            self.desk.close.remote(f"the warm pool failed: {self.failed}")

    def describe(self) -> dict[str, Any]:
        return {"shape": self.shape, "failed": self.failed, "dir": str(self.dir)}

    def stop(self) -> None:
        """Close the desk: the gang's workers return once their job (if any) is done, and the fit ends."""
        self.desk.close.remote("the warm pool was taken down")
        self.thread.join(timeout=120)


def _keeper() -> Any | None:
    try:
        return ray.get_actor(KEEPER, namespace=NAMESPACE)
    except ValueError:
        return None


def pool_up(cfg: LaunchConfig, the_plan: Plan, address: str) -> tuple[dict[str, Any], float]:
    """Start the pool on the cluster at `address` and wait for its workers; returns its shape and the wait."""
    from orchestrator.local_ray import join

    started = time.perf_counter()
    join(address)
    try:
        if _keeper() is not None:
            raise ConfigError(f"a warm pool is already up at {address}: take it down first with"
                              f" `orchestrator pool down --address {address}`")
        keeper = PoolKeeper.options(name=KEEPER, namespace=NAMESPACE, lifetime="detached").remote(cfg, the_plan)
        info = ray.get(keeper.describe.remote())
        answer = ray.get(ray.get_actor(DESK, namespace=NAMESPACE).ready.remote(READY_TIMEOUT_S))
        if answer is not True:
            _take_down(keeper)
            why = answer or f"its workers did not start within {READY_TIMEOUT_S:.0f} s"
            raise RunFailed(f"the warm pool did not start: {why} (logs: {info['dir']}/logs)")
    finally:
        ray.shutdown()
    return info, time.perf_counter() - started


def pool_down(address: str) -> None:
    from orchestrator.local_ray import join

    join(address)
    try:
        keeper = _keeper()
        if keeper is None:
            raise ConfigError(f"no warm pool is up at {address} (start one with `orchestrator pool up`)")
        _take_down(keeper)
    finally:
        ray.shutdown()


def _take_down(keeper: Any) -> None:
    with contextlib.suppress(ray.exceptions.RayActorError):
        ray.get(keeper.stop.remote(), timeout=150)
    ray.kill(keeper)  # and with it the desk and the trainer it owns


def find_pool(the_plan: Plan) -> bool:
    """Whether the cluster this driver joined has a warm pool this launch can run on."""
    keeper = _keeper()
    if keeper is None:
        return False
    info = ray.get(keeper.describe.remote())
    if info["failed"]:
        log.warning("the warm pool failed (%s): this launch starts its own workers", info["failed"])
        return False
    if info["shape"] != shape(the_plan):
        log.warning("the warm pool's workers (%s) do not fit this launch (%s): it starts its own, once the pool's"
                    " resources allow (`orchestrator pool down` frees them)", info["shape"], shape(the_plan))
        return False
    return True


def keep_checkpoint(path: Path, run_dir: Path, keep: int) -> Path:
    """Move a reported checkpoint into the run folder under a Ray-style name (they sort by time), keep the
    newest `keep`."""
    dest = run_dir / f"checkpoint_{datetime.now().strftime('%Y-%m-%d_%H-%M-%S.%f')}"
    os.replace(path, dest)  # the staging folder is inside the run folder: one rename, complete or absent
    for old in checkpoints_in(run_dir)[keep:]:
        shutil.rmtree(old, ignore_errors=True)
    return dest


def run_on_pool(cfg: LaunchConfig, run_dir: Path, resume: bool) -> tuple[list[dict[str, float]], Path | None]:
    """Run the launch's training as one job on the pool; returns its rows and its latest checkpoint."""
    from orchestrator.progress import progress_bar

    job = {"trial_id": run_dir.name, "train": cfg.train.model_dump(mode="json"), "rows": True,
           "resume": [str(p) for p in checkpoints_in(run_dir)] if resume else [], "staging": str(run_dir / ".staging"),
           "log_dir": str(run_dir / "logs"), "run_dir": str(run_dir)}
    rows: list[dict[str, float]] = []
    bar, update = progress_bar(cfg.train.epochs) if not cfg.quiet else (contextlib.nullcontext(), None)

    def on_row(row: dict[str, float]) -> None:
        rows.append(row)
        if update is not None:
            update(rows)

    def on_report(metrics: dict[str, Any], path: str | None) -> None:
        if path:
            keep_checkpoint(Path(path), run_dir, cfg.keep_checkpoints)

    log.info("run %s on the warm pool", run_dir.name)
    with bar:
        try:
            serve([DESK], job, on_report, on_row, WAIT_FOR_POOL_S, NAMESPACE)
        except JobFailed as exc:
            raise RunFailed(f"{exc} (logs: {run_dir / 'logs'})") from None
    latest = checkpoints_in(run_dir)
    return rows, latest[0] if latest else None
