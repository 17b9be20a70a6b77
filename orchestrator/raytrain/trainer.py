"""The one TorchTrainer factory: a worker function and its typed argument, shaped by a plan (workers,
resources, placement, backend, the spec's NCCL/gloo environment). Own groups, sweep trials, warm groups and
pools are all built here; `failure_line` says in one line why a fit failed."""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
import ray.train
from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback
from ray.train.v2._internal.constants import get_env_vars_to_propagate
from ray.train.v2._internal.execution.callback import WorkerGroupCallback
from ray.train.v2._internal.execution.scaling_policy import FixedScalingPolicy
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

from cluster.plan import Plan
from groundwork.errors import ConfigError, JobError, ScriptExited
from groundwork.remote import split
from orchestrator.raytrain.backend import LeanTorchConfig
from orchestrator.raytrain.embedded import EmbeddedController, held_env_only
from orchestrator.raytrain.preemption import ListenForSigterm, SigtermIsPreemption
from orchestrator.raytrain.session import (
    HEALTH_CHECK_ENV,
    HEALTH_CHECK_S,
    WARN_BLOCKING,
    WARN_BLOCKING_ENV,
    embedded_env,
)

ABORT_TIMEOUT_S = 30
EXPECTED = (ConfigError, JobError)  # errors a run may meet that its message says all of


class _NoDatasets(WorkerGroupCallback):
    def before_init_train_context(self, workers: list) -> dict[str, list]:
        return {"dataset_shard_provider": [None] * len(workers)}  # TrainContext requires the field


class StaticScaling(FixedScalingPolicy):
    """Ray's fixed-size policy without the AutoscalingCoordinator (a Ray Data actor, started by the first run
    on a cluster and waited for: a process importing Ray Data) that asks an autoscaler for the group's
    resources. A Ray this driver started has no autoscaler and no node to add."""

    def after_controller_start(self, train_run_context: Any) -> None:
        pass

    def _maybe_send_resource_request(self) -> None:
        pass


class LeanTrainer(DataParallelTrainer):
    """Ray's TorchTrainer, with a torch backend whose config imports no torch (orchestrator.raytrain.backend),
    whose Ctrl-C ends the run and says so, without two per-run processes our runs never use
    (each a Python that imports Ray's libraries on a machine whose cores are busy importing torch for the
    workers):
    - Ray's PlacementGroupCleaner polls the State API, which needs the dashboard we keep off; a launch's
      group goes with its job, and a sweep's reaper removes a stopped trial's group.
    - Ray Data's DatasetManager actor, which Train's DatasetsCallback starts even for a trainer without Ray
      Datasets (ours never have any: the loop reads its own DataLoaders).
    On a Ray this driver started, without Ray Datasets, also without Ray Data's AutoscalingCoordinator (see
    StaticScaling), the controller has no runtime env where its variables hold in every process of that
    Ray already (it then takes a worker process Ray prestarted), and the workers none for the variables that
    hold there (EmbeddedController).
    With `sigterm_notice`, SIGTERM to a worker is a preemption notice (see orchestrator.raytrain.preemption).
    With `controller_in_driver`, the controller runs in this process (see EmbeddedController)."""

    def __init__(self, *args: Any, sigterm_notice: bool = False, controller_in_driver: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sigterm_notice = sigterm_notice
        self.controller_in_driver = controller_in_driver

    def _create_default_callbacks(self) -> list:
        # Ray 2.60 internals: both are among the default controller callbacks.
        out = [ListenForSigterm()] if self.sigterm_notice else []
        for callback in super()._create_default_callbacks():
            if isinstance(callback, DatasetsCallback) and not self.datasets:
                out.append(_NoDatasets())
            elif not isinstance(callback, PlacementGroupCleanerCallback):
                out.append(callback)
        return out

    def _register_sigint_handler(self, controller: Any) -> None:
        """Ctrl-C aborts the run as Ray's own handler does (the controller ends the worker group: every rank,
        and the script each started, on every node), then raises KeyboardInterrupt in fit(), so the caller
        knows (the CLI: "interrupted", exit 130); Ray's handler ends the process with exit 1 and no word."""
        def on_sigint(signum: int, frame: Any) -> None:
            signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C cuts the abort short
            with contextlib.suppress(Exception):  # the controller may be gone already
                ray.get(controller.abort.remote(), timeout=ABORT_TIMEOUT_S)
            raise KeyboardInterrupt

        signal.signal(signal.SIGINT, on_sigint)

    def _initialize_and_run_controller(self, **controller_init_kwargs: Any) -> Any:
        # Ray 2.60: the policies are controller arguments that fit() makes
        if self.sigterm_notice:
            controller_init_kwargs["failure_policy"] = SigtermIsPreemption(self.run_config.failure_config)
        embedded = embedded_env() is not None and not self.datasets
        if embedded and type(controller_init_kwargs["scaling_policy"]) is FixedScalingPolicy:  # not elastic
            controller_init_kwargs["scaling_policy"] = StaticScaling(self.scaling_config)
        if self.controller_in_driver:
            return EmbeddedController(held_env=embedded_env() or {}, in_driver=True,
                                      **controller_init_kwargs).run_here()
        if not embedded or not controller_env_in_place():
            return super()._initialize_and_run_controller(**controller_init_kwargs)
        # Ray's method, less the controller's runtime env
        controller = ray.remote(num_cpus=0, label_selector={
            ray._raylet.RAY_NODE_ID_KEY: ray.get_runtime_context().get_node_id()})(EmbeddedController).remote(
            held_env=embedded_env(), **controller_init_kwargs)
        if threading.current_thread() is threading.main_thread():
            self._register_sigint_handler(controller)
        ray.get(controller.run.remote())
        return ray.get(controller.get_result.remote())

    def fit(self) -> Any:
        os.environ.setdefault(HEALTH_CHECK_ENV, HEALTH_CHECK_S)
        previous = signal.getsignal(signal.SIGINT)
        try:
            return super().fit()
        finally:
            if threading.current_thread() is threading.main_thread():  # (where fit registers its handler)
                signal.signal(signal.SIGINT, previous)


def controller_env_in_place() -> bool:
    """Whether every variable Ray's fit() hands its controller in a runtime env holds in every process of
    the Ray this driver started already (see orchestrator.raytrain.session.embedded_env)."""
    wanted = {WARN_BLOCKING_ENV: WARN_BLOCKING, **get_env_vars_to_propagate()}  # Ray 2.60's
    return not held_env_only({"env_vars": wanted}, embedded_env() or {})


def importable_from_here() -> dict[str, str]:
    """The driver's working directory on the workers' import path, as `python -m` puts it on the driver's: a
    user's own model, dataset or train function in this folder imports there too (Ray expands ${PYTHONPATH}
    to the worker's own). Nothing where it is there already: a Ray this driver started has it first."""
    here = os.getcwd()
    if (embedded_env() or {}).get("PYTHONPATH", "").split(os.pathsep)[0] == here:
        return {}
    return {"PYTHONPATH": f"{here}{os.pathsep}${{PYTHONPATH}}"}


def ray_datasets(paths: dict[str, str]) -> dict[str, Any]:
    """Ray Data datasets from Parquet paths, for a train function's ray.train.get_dataset_shard(name)."""
    if not paths:
        return {}
    import ray.data  # deferred: importing Ray Data takes seconds, and only runs that name datasets use it

    return {name: ray.data.read_parquet(path) for name, path in paths.items()}


def make_trainer(worker: Callable[[Any], None], args: Any, the_plan: Plan, run_dir: Path, *,
                 keep_checkpoints: int | None = None, max_failures: int = 0, callbacks: list | None = None,
                 datasets: dict[str, str] | None = None, backend: str | None = None,
                 nsight: bool = False, min_workers: int | None = None, sigterm_notice: bool = False,
                 remote: str | None = None, controller_in_driver: bool = False) -> LeanTrainer:
    """A TorchTrainer whose every rank runs `worker(args)`; Ray Train's own run folder is `run_dir`. The
    workers' process group uses the plan's backend, or `backend` (gloo: a script's workers only coordinate).
    With `min_workers`, elastic (Train V2): the group starts with as many of the plan's workers as fit, at
    least `min_workers`, and restarts with those that remain after a node is lost. With `sigterm_notice`, a
    worker told SIGTERM checkpoints and the restart is not a failure (the shared loop's workers only). With
    `remote` (the run folder's URI), Ray Train keeps the checkpoints there rather than in `run_dir`."""
    return LeanTrainer(
        functools.partial(worker, args),  # no config dict: the worker gets its typed argument as is
        datasets=ray_datasets(datasets or {}),
        backend_config=LeanTorchConfig(backend=backend or the_plan.backend),
        scaling_config=ray.train.ScalingConfig(
            num_workers=(min_workers, the_plan.workers) if min_workers else the_plan.workers,
            use_gpu=the_plan.use_gpu,
            resources_per_worker=the_plan.resources_per_worker,
            placement_strategy=the_plan.placement_strategy,
        ),
        run_config=ray.train.RunConfig(
            name=run_dir.name, storage_path=split(remote)[0] if remote else str(run_dir.parent),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=keep_checkpoints),
            failure_config=ray.train.FailureConfig(max_failures=max_failures),
            # nsight: Ray runs each worker under Nsight Systems (`nsys profile`), its report in the node's
            # session logs (collected by the launcher)
            worker_runtime_env={"env_vars": {**the_plan.env, **importable_from_here()},
                                **({"_nsight": "default"} if nsight else {})},  # RuntimeEnv(nsight=...) in 2.60
            callbacks=callbacks,
        ),
        sigterm_notice=sigterm_notice,
        controller_in_driver=controller_in_driver,
    )


def failure_line(error: Exception, hangs: list[str], run_dir: Path) -> str:
    """The cause of a failed fit() in one line: the watchdog's finding, else the first rank's own error. An
    error the run expects (bad settings or data, a nan loss, a corrupt checkpoint) is its message alone; any
    other names the rank log that holds its traceback."""
    logs = run_dir / "logs"
    if hangs:
        return f"{hangs[-1]} (logs: {logs})"
    failures = getattr(error, "worker_failures", None) or {}
    # RayTaskError wraps the worker's own exception
    causes = {rank: getattr(f, "cause", None) or f for rank, f in failures.items()}
    exits = [c for c in causes.values() if isinstance(c, ScriptExited)]
    if exits:  # a script's exit names its rank; the first to exit took the others down
        first_exit = min(exits, key=lambda e: e.at)
        return f"{first_exit} (its output: {logs / f'rank-{first_exit.rank}.log'})"
    if not causes:
        return storage_full(error, run_dir) or f"{type(error).__name__}: {last_line(error)} (logs: {logs})"
    rank = min(causes)
    first = causes[rank]
    line = f"rank {rank}: {type(first).__name__}: {last_line(first)}"
    if (full := storage_full(first, run_dir)) is not None:
        return f"rank {rank}: {full}"
    return line if isinstance(first, EXPECTED) else f"{line} (traceback: {logs / f'rank-{rank}.log'})"


def storage_full(error: BaseException, run_dir: Path) -> str | None:
    """The line for a run whose storage filled up (ENOSPC or a quota, wherever in the error's chain), else
    None. The checkpoint being written is cut short and skipped on resume; the one before it is whole."""
    seen: BaseException | None = error
    while seen is not None:
        if getattr(seen, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "No space left on device" in str(seen):
            return (f"the storage is full: no space left under {run_dir.parent} while writing the run: free some"
                    f" (or set storage.path in the cluster spec elsewhere), then --resume {run_dir.name} continues"
                    " from its newest complete checkpoint")
        seen = seen.__cause__ or seen.__context__ or getattr(seen, "cause", None)
        if seen is error:
            break
    return None


def last_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[-1] if text else ""
