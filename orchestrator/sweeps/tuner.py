"""Run a sweep with Ray Tune. Tune searches and schedules; trials run either on warm groups kept up for the
whole sweep (orchestrator.warm: the default whenever every trial has the same shape), or each as its own Ray
Train run (see orchestrator.sweeps.trials). Either way the trial function holds no CPU, so a trial's workers
are exactly its worker group, and the number of trials at once is how many groups fit the cluster."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray import tune
from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback
from ray.tune.search import ConcurrencyLimiter
from ray.tune.search.basic_variant import BasicVariantGenerator

from cluster.plan import Plan
from groundwork.errors import ConfigError
from orchestrator.config import LaunchConfig
from orchestrator.raytrain.session import environment, on_this_node
from orchestrator.sweeps.config import Choice, LogUniform, RandInt, SweepConfig, Uniform
from orchestrator.sweeps.live import LiveTrialTable
from orchestrator.sweeps.reaper import PlacementGroupRegistry, ReapPlacementGroups
from orchestrator.sweeps.results import reports_of
from orchestrator.sweeps.trials import TrialContext, trial_launch, trial_on_own_group, trial_on_warm_group
from orchestrator.warm.driver import WarmGroups

log = logging.getLogger(__name__)
WARM_DIR = "warm-groups"  # under the sweep folder: each group's logs, group-<i>/logs/rank-<r>.log
# Tune's loggers are the ones the sweep passes (callbacks), not its defaults too: its TensorBoard logger wrote
# every trial's every report on the driver, on the CPUs the trials train on (~1.4% of a 30-epoch digits
# sweep's time after its first step on 2 CPUs, measured alternated); the sweep writes tb/ at its end instead.
OWN_LOGGERS = {"TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1"}


def tune_space(cfg: SweepConfig) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, p in cfg.space.items():
        if isinstance(p, LogUniform):
            out[key] = tune.loguniform(p.low, p.high)
        elif isinstance(p, Uniform):
            out[key] = tune.uniform(p.low, p.high)
        elif isinstance(p, RandInt):
            out[key] = tune.randint(p.low, p.high)
        elif isinstance(p, Choice):
            out[key] = tune.grid_search(p.values) if p.type == "grid" else tune.choice(p.values)
    return out


def concurrent_trials(the_plan: Plan, resources: dict[str, float], cap: int | None = None) -> int:
    """How many trials' worker groups fit the live cluster at once (at least 1, at most `cap`)."""
    fits = []
    for key, per_worker in the_plan.resources_per_worker.items():
        group = per_worker * the_plan.workers
        fits.append(math.floor(resources.get(key, 0.0) / group + 1e-9))
    limit = max(1, min(fits))
    return min(limit, cap or limit)


def search_algorithm(cfg: SweepConfig, concurrency: int):
    """The search, limited to `concurrency` trials at once. The limit must be here: Tune's own
    max_concurrent_trials is ignored for the random/grid generator, and since trial drivers hold no
    resources, every trial would start and wait on the others' GPUs/CPUs (Train gives up after 60 s)."""
    if cfg.search == "optuna":
        from ray.tune.search.optuna import OptunaSearch  # deferred: importing optuna takes seconds

        optuna = OptunaSearch(metric=cfg.metric, mode=cfg.mode, seed=cfg.base.train.seed)
        return ConcurrencyLimiter(optuna, max_concurrent=concurrency)
    # Seeded, so a sweep samples the same trials every time it runs.
    return BasicVariantGenerator(random_state=cfg.base.train.seed, max_concurrent=concurrency)


def scheduler(cfg: SweepConfig):
    s = cfg.scheduler
    if s.type == "asha":
        return tune.schedulers.ASHAScheduler(time_attr="training_iteration", max_t=cfg.base.train.epochs,
                                             grace_period=s.grace_period, reduction_factor=s.reduction_factor)
    if s.type == "pbt":
        return tune.schedulers.PopulationBasedTraining(
            time_attr="training_iteration", perturbation_interval=s.perturbation_interval,
            hyperparam_mutations=tune_space(cfg.model_copy(update={
                "space": {k: v for k, v in cfg.space.items() if not (isinstance(v, Choice) and v.type == "grid")}
            })),
        )
    return tune.schedulers.FIFOScheduler()


@dataclass(frozen=True)
class SweepResult:
    name: str
    path: Path
    best_config: LaunchConfig
    best_metric: float
    seconds: float
    results: Any  # ray.tune.ResultGrid
    concurrency: int | None  # trials at once; None when resumed (Tune keeps the first run's setting)
    warm_group_starts: list[int] = field(default_factory=list)  # per warm group: 1, plus one per restart


def callbacks(cfg: SweepConfig, sweep_dir: Path, quiet: bool) -> list[tune.Callback]:
    """Tune's CSV and JSON loggers (the sweep's results read them), not its TensorBoard one (see OWN_LOGGERS)."""
    # A warm group's placement group lives as long as the sweep; a trial's own group is reaped when it stops.
    reap: list[tune.Callback] = [] if cfg.on_warm_groups else [ReapPlacementGroups(registry_name(sweep_dir))]
    own = [*reap, CSVLoggerCallback(), JsonLoggerCallback()]
    return own if quiet else [*own, LiveTrialTable(cfg.metric, cfg.mode, cfg.base.train.epochs)]


def registry_name(sweep_dir: Path) -> str:
    return f"orchestrator-pg-registry-{sweep_dir.name}"


def desk_prefix(sweep_dir: Path) -> str:
    """The start of the names of a sweep's desks; its trials find them by it."""
    return f"orchestrator-desk-{sweep_dir.name}-"


def trainable(cfg: SweepConfig, sweep_dir: Path) -> Any:
    """The trial function with what every trial shares (not searched) bound to it."""
    context = TrialContext(base=cfg.base.model_copy(update={"quiet": True}), trials_dir=str(sweep_dir / "trials"),
                           registry=registry_name(sweep_dir), desk_prefix=desk_prefix(sweep_dir))
    trial = trial_on_warm_group if cfg.on_warm_groups else trial_on_own_group
    # Tune refuses an all-zero request; 1 MiB of `memory` (a resource every node has) with 0 CPU keeps the
    # trial driver from taking a CPU its own workers need, which would deadlock a 2-CPU machine.
    return tune.with_resources(tune.with_parameters(trial, context=context), {"cpu": 0, "memory": 2**20})


def make_tuner(cfg: SweepConfig, sweep_dir: Path, concurrency: int | None, quiet: bool = False) -> tune.Tuner:
    """A new Tuner running `concurrency` trials at once, or (concurrency None) the sweep's saved one."""
    if concurrency is None:
        return tune.Tuner.restore(str(sweep_dir), trainable=trainable(cfg, sweep_dir), resume_unfinished=True,
                                  resume_errored=True)
    return tune.Tuner(
        trainable(cfg, sweep_dir),
        param_space=tune_space(cfg),
        tune_config=tune.TuneConfig(
            metric=cfg.metric, mode=cfg.mode, num_samples=cfg.num_samples,
            search_alg=search_algorithm(cfg, concurrency),
            scheduler=scheduler(cfg), time_budget_s=cfg.time_budget_s,
            reuse_actors=cfg.on_warm_groups,  # a warm-group trial's actor is a light client: keep it
        ),
        run_config=tune.RunConfig(name=sweep_dir.name, storage_path=str(sweep_dir.parent), verbose=0,
                                  callbacks=callbacks(cfg, sweep_dir, quiet),
                                  checkpoint_config=tune.CheckpointConfig(num_to_keep=checkpoints_to_keep(cfg))),
    )


def checkpoints_to_keep(cfg: SweepConfig) -> int | None:
    """Per trial. PBT keeps them all: a trial cloned from another loads that trial's checkpoint while its
    owner trains on, and Tune would delete it from under the reader (Tune warns at <= 2)."""
    return None if cfg.scheduler.type == "pbt" else cfg.base.keep_checkpoints


def best_of(cfg: SweepConfig, results: Any) -> tuple[LaunchConfig, float]:
    try:
        best = results.get_best_result(metric=cfg.metric, mode=cfg.mode, scope="all")
    except RuntimeError as exc:
        raise ConfigError(f"no trial reported {cfg.metric!r}: {exc}") from None
    reports = reports_of(best)
    values = [] if reports is None or cfg.metric not in reports else reports[cfg.metric].dropna().tolist()
    best_value = (max if cfg.mode == "max" else min)(values or [best.metrics[cfg.metric]])
    launch = trial_launch(cfg.base, best.config).model_copy(update={"name": None, "quiet": False})
    return launch, float(best_value)


def run_sweep(cfg: SweepConfig, the_plan: Plan, sweep_dir: Path, resume: bool = False,
              quiet: bool = False) -> SweepResult:
    """Run the sweep on the connected Ray; `the_plan` is the base launch's, checked by the caller."""
    started = time.perf_counter()
    # Every trial checkpoints each epoch by design, so Tune's "snapshotting triggered multiple times" warning
    # would repeat all sweep long.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    concurrency = concurrent_trials(the_plan, ray.cluster_resources(), cfg.max_concurrent_trials)
    log.info("running up to %d trial(s) at once%s", concurrency, " on warm groups" if cfg.on_warm_groups else "")
    with trial_workers(cfg, the_plan, sweep_dir, concurrency) as groups, environment(OWN_LOGGERS):
        results = make_tuner(cfg, sweep_dir, None if resume else concurrency, quiet).fit()
    starts = groups.starts if groups is not None else []
    if any(n > 1 for n in starts):
        log.warning("warm groups restarted %d time(s) in this sweep", sum(n - 1 for n in starts))
    best, value = best_of(cfg, results)
    return SweepResult(sweep_dir.name, sweep_dir, best, value, time.perf_counter() - started, results,
                       None if resume else concurrency, starts)


@contextlib.contextmanager
def trial_workers(cfg: SweepConfig, the_plan: Plan, sweep_dir: Path, concurrency: int) -> Iterator[WarmGroups | None]:
    """What trials run on, for the length of the sweep: warm groups (yielded; their `starts` are read once the
    sweep is over), or the registry of per-trial groups (yields None)."""
    if cfg.on_warm_groups:
        # Each trial may cost a group one restart (a worker that died); more, and the group gives up.
        groups = WarmGroups(the_plan, sweep_dir / WARM_DIR, concurrency, max_failures=cfg.num_samples,
                            desk_prefix=desk_prefix(sweep_dir))
        with groups:
            yield groups
        return
    # Named, owned by this driver: it lives exactly as long as the sweep does.
    registry = ray.remote(num_cpus=0)(PlacementGroupRegistry).options(
        name=registry_name(sweep_dir), scheduling_strategy=on_this_node()).remote()
    ray.get(registry.pop.remote())  # wait until it is up before any trial looks it up
    yield None
