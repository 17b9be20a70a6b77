"""`orchestrator launch`: validate everything, then plan, start (or join) Ray, run a TorchTrainer over the
shared loop, and write the run's results. Nothing is written before the config is known to be good."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.plan import JobRequest, Plan, plan, resolve_storage
from cluster.spec import ClusterSpec, load_spec
from orchestrator.config import LaunchConfig, load_launch_config, write_launch_config
from orchestrator.results import dedupe_rows, plot_loss, read_rows, write_rows
from trainables.errors import ConfigError, RunFailed
from trainables.parallel.dp import check_one_worker
from trainables.run import check_config

log = logging.getLogger(__name__)
DEFAULT_SPEC = Path(__file__).resolve().parent.parent / "cluster" / "examples" / "local.yaml"
LAUNCH_FILE = "launch.yaml"


@dataclass(frozen=True)
class RunResult:
    name: str
    path: Path
    metrics: dict[str, float]  # the last validation report
    checkpoint: Path | None  # the latest checkpoint folder (holds state.pt)
    rows: list[dict[str, float]]
    seconds: float


def cluster_spec(cfg: LaunchConfig) -> ClusterSpec:
    return load_spec(cfg.cluster or DEFAULT_SPEC)


def job_request(cfg: LaunchConfig) -> JobRequest:
    return JobRequest(workers=cfg.workers, gpus_per_worker=cfg.gpus_per_worker,
                      cpus_per_worker=cfg.cpus_per_worker, placement=cfg.placement, node_group=cfg.node_group)


def check_entry(entry: str) -> None:
    from orchestrator.worker import resolve_entry

    try:
        resolve_entry(entry)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"entry {entry!r} cannot be loaded ({exc}): check the module is importable") from None


def prepare_run(cfg: LaunchConfig, spec: ClusterSpec, the_plan: Plan, resume: bool) -> tuple[LaunchConfig, Path]:
    name = cfg.name or f"{cfg.train.model}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = Path(the_plan.storage_path) / name
    exists = (run_dir / LAUNCH_FILE).exists()
    if resume and not exists:
        raise ConfigError(f"--resume {name}: no run at {run_dir}: list runs with `ls {the_plan.storage_path}`")
    if not resume and exists:
        raise ConfigError(f"run {name!r} already exists at {run_dir}: continue it with --resume {name}"
                          " or choose another --name")
    return cfg.model_copy(update={"name": name}), run_dir


def resumed_config(name: str, overrides: dict[str, Any], spec_path: str | None) -> LaunchConfig:
    """The config a run started with (its launch.yaml), with the caller's overrides on top."""
    spec = load_spec(spec_path or DEFAULT_SPEC)
    saved = Path(resolve_storage(spec)) / name / LAUNCH_FILE
    if not saved.exists():
        raise ConfigError(f"--resume {name}: no run at {saved.parent}")
    base = load_launch_config(saved)
    return merge(base, overrides)


def merge(base: LaunchConfig, overrides: dict[str, Any]) -> LaunchConfig:
    data = base.model_dump()
    data["train"].update(overrides.pop("train", {}))
    data.update(overrides)
    return LaunchConfig.model_validate(data)


def _worker_config(cfg: LaunchConfig, run_dir: Path, sink: Any) -> dict[str, Any]:
    user_config = {**cfg.train.model_dump(), "run_dir": str(run_dir)}
    return {"train": cfg.train.model_dump(), "sink": sink, "log_dir": str(run_dir / "logs"),
            "run_dir": str(run_dir), "entry": cfg.entry, "user_config": user_config}


def lean_trainer_class() -> type:
    """TorchTrainer without two per-run processes our runs never use (each a Python that imports Ray's
    libraries on a machine whose cores are busy importing torch for the workers):
    - Ray's PlacementGroupCleaner polls the State API, which needs the dashboard we keep off; a launch's
      group goes with its job, and a sweep's reaper removes a stopped trial's group.
    - Ray Data's DatasetManager actor, which Train's DatasetsCallback starts even for a trainer without Ray
      Datasets (ours never have any: the loop reads its own DataLoaders)."""
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback
    from ray.train.v2._internal.execution.callback import WorkerGroupCallback

    class NoDatasets(WorkerGroupCallback):
        def before_init_train_context(self, workers: list) -> dict[str, list]:
            return {"dataset_shard_provider": [None] * len(workers)}  # TrainContext requires the field

    class LeanTrainer(TorchTrainer):
        def _create_default_callbacks(self) -> list:
            # Ray 2.60 internals: both are among the default controller callbacks.
            out = []
            for callback in super()._create_default_callbacks():
                if isinstance(callback, DatasetsCallback) and not self.datasets:
                    out.append(NoDatasets())
                elif not isinstance(callback, PlacementGroupCleanerCallback):
                    out.append(callback)
            return out

    return LeanTrainer


def make_trainer(cfg: LaunchConfig, the_plan: Plan, run_dir: Path, sink: Any, callbacks: list | None = None,
                 extra: dict[str, Any] | None = None, worker: Callable[[dict[str, Any]], None] | None = None):
    """A TorchTrainer of `worker` (default: the shared loop's train_worker) shaped by the plan."""
    import ray.train
    from ray.train.torch import TorchConfig

    from orchestrator.worker import train_worker

    return lean_trainer_class()(
        worker or train_worker,
        train_loop_config={**_worker_config(cfg, run_dir, sink), **(extra or {})},
        torch_config=TorchConfig(backend=the_plan.backend),
        scaling_config=ray.train.ScalingConfig(
            num_workers=the_plan.workers, use_gpu=the_plan.use_gpu,
            resources_per_worker=the_plan.resources_per_worker,
            placement_strategy=the_plan.placement_strategy,
        ),
        run_config=ray.train.RunConfig(
            name=run_dir.name, storage_path=str(run_dir.parent),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.keep_checkpoints),
            failure_config=ray.train.FailureConfig(max_failures=cfg.max_failures),
            worker_runtime_env={"env_vars": the_plan.env},
            callbacks=callbacks,
        ),
    )


def failure_line(error: Exception, hangs: list[str], run_dir: Path) -> str:
    """The cause of a failed fit() in one line: the watchdog's finding, else the first rank's own error."""
    if hangs:
        cause = hangs[-1]
    else:
        failures = getattr(error, "worker_failures", None) or {}
        first = failures[min(failures)] if failures else error
        cause = getattr(first, "cause", None) or first  # RayTaskError wraps the worker's own exception
        rank = f"rank {min(failures)}: " if failures else ""
        cause = f"{rank}{type(cause).__name__}: {str(cause).strip().splitlines()[-1] if str(cause).strip() else ''}"
    return f"{cause} (logs: {run_dir / 'logs'})"


def _fit(cfg: LaunchConfig, the_plan: Plan, run_dir: Path, resume: bool) -> tuple[list[dict[str, float]], Path | None]:
    import ray
    from ray.train import TrainingFailedError

    from orchestrator.progress import LiveRows, progress_bar
    from orchestrator.sink import MetricsSink
    from orchestrator.watchdog import Watchdog

    sink = MetricsSink.options(name=f"orchestrator-sink-{run_dir.name}").remote()
    trainer = make_trainer(cfg, the_plan, run_dir, sink, extra={"resuming": resume})
    bar, update = progress_bar(cfg.train.epochs) if not cfg.quiet else (contextlib.nullcontext(), None)
    try:
        with bar, LiveRows(sink, update) as live, Watchdog(sink, cfg.hang_timeout) as watchdog:
            try:
                result = trainer.fit()
            except TrainingFailedError as exc:
                raise RunFailed(failure_line(exc, watchdog.hangs, run_dir)) from exc
    finally:
        ray.kill(sink)  # now, not when Ray collects the handle: a --resume in this process reuses its name
    for hang in watchdog.hangs:  # hangs the run survived by restarting (--max-failures)
        log.warning("restarted after a hang: %s", hang)
    return live.rows, Path(result.checkpoint.path) if result.checkpoint else None


def _on_pool(cfg: LaunchConfig, the_plan: Plan, address: str | None) -> bool:
    """Whether this launch runs on the warm pool of the cluster it joined (see orchestrator.pool)."""
    if address is None or cfg.entry:
        return False
    from orchestrator.pool import find_pool

    return find_pool(the_plan)


def checked_plan(cfg: LaunchConfig) -> tuple[ClusterSpec, Plan, str | None]:
    """Spec, plan and Ray address for a launch, after every check that needs no cluster."""
    spec = cluster_spec(cfg)
    the_plan = plan(spec, job_request(cfg))
    check_config(cfg.train)
    if cfg.train.strategy == "dp":
        check_one_worker(cfg.workers)
    if cfg.entry:
        check_entry(cfg.entry)
    address = cfg.address or spec.address
    if address is None and spec.num_nodes > 1:
        raise ConfigError(f"the cluster spec describes {spec.num_nodes} nodes but no Ray address is given:"
                          " pass --address or set address: in the spec")
    return spec, the_plan, address


def launch(cfg: LaunchConfig, resume: bool = False) -> RunResult:
    """Run one training job to the end and return where its results are."""
    from orchestrator.local_ray import ray_session

    spec, the_plan, address = checked_plan(cfg)
    cfg, run_dir = prepare_run(cfg, spec, the_plan, resume)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_launch_config(cfg, run_dir / LAUNCH_FILE)
    started = time.perf_counter()
    with ray_session(spec, address, cfg.dashboard):
        if _on_pool(cfg, the_plan, address):
            from orchestrator.pool import run_on_pool

            new_rows, checkpoint = run_on_pool(cfg, run_dir, resume)
        else:
            new_rows, checkpoint = _fit(cfg, the_plan, run_dir, resume)
    rows = dedupe_rows(read_rows(run_dir) + new_rows)  # a resumed run appends to what it wrote before
    if rows:
        write_rows(rows, run_dir)
        plot_loss(rows, run_dir, f"{cfg.name}: {cfg.train.model}, {cfg.workers} worker(s)")
    last_val = next((r for r in reversed(rows) if r.get("val_acc") is not None), {})
    return RunResult(cfg.name or "", run_dir, last_val, checkpoint, rows, time.perf_counter() - started)
