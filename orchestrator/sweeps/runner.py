"""Run a sweep with Ray Tune. Trials run either on warm worker groups kept up for the whole sweep
(orchestrator.sweeps.gangs: the default whenever every trial has the same shape), or each as its own Ray
Train run: a small Tune trial driver that builds and fits a TorchTrainer of the shared loop (Ray 2.60's Train
V2 pattern; `Tuner(trainer)` is gone). Either way the trial function holds no CPU, so a trial's gang is
exactly its workers, and the number of trials at once is how many gangs fit the cluster."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray import tune

from cluster.plan import Plan
from orchestrator.api import split_overrides
from orchestrator.config import LaunchConfig
from orchestrator.launcher import checked_plan, make_trainer, merge
from orchestrator.sweeps.config import Choice, LogUniform, RandInt, SweepConfig, Uniform
from orchestrator.sweeps.gangs import desk_prefix, gangs
from orchestrator.sweeps.live import LiveTrialTable
from orchestrator.sweeps.reaper import PlacementGroupRegistry, ReapPlacementGroups
from orchestrator.sweeps.results import reports_of
from trainables.errors import ConfigError

log = logging.getLogger(__name__)
BASE_KEY = "__base__"  # the trial's base launch, carried in the param space (not searched)
TRIALS_KEY = "__trials_dir__"  # where trials keep their Ray Train runs
REGISTRY_KEY = "__pg_registry__"  # the named actor trials register their placement groups with
DESKS_KEY = "__desks__"  # the name prefix of the gangs' desks (orchestrator.sweeps.gangs)


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


def trial_config(config: dict[str, Any]) -> LaunchConfig:
    """A trial's launch: the base with this trial's sampled values on top."""
    base = LaunchConfig.model_validate(config[BASE_KEY])
    return merge(base, split_overrides(sampled_values(config)))


def sampled_values(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if not k.startswith("__")}


def trial_driver(config: dict[str, Any]) -> None:
    """One Tune trial = one full Ray Train run; metrics reach Tune through TuneReportCallback."""
    from ray.tune.integration.ray_train import TuneReportCallback

    cfg = trial_config(config)
    _, the_plan, _ = checked_plan(cfg)
    trial_id = tune.get_context().get_trial_id()
    extra = {"pg_registry": config[REGISTRY_KEY], "trial_id": trial_id}
    make_trainer(cfg, the_plan, Path(config[TRIALS_KEY]) / trial_id, sink=None, callbacks=[TuneReportCallback()],
                 extra=extra).fit()


def trial_on_gang(config: dict[str, Any]) -> None:
    """One Tune trial run by one of the sweep's warm worker groups; its reports reach Tune through here."""
    from orchestrator.sweeps.gangs import serve_trial

    cfg = trial_config(config)
    trial_id = tune.get_context().get_trial_id()
    resume = tune.get_checkpoint()  # set when Tune resumes the trial, or PBT hands it another's weights
    prefix = config[DESKS_KEY]
    desks = sorted(name for name in ray.util.list_named_actors() if name.startswith(prefix))
    job = {"trial_id": trial_id, "train": cfg.train.model_dump(mode="json"), "sampled": sampled_values(config),
           "resume": [resume.path] if resume else [],
           "staging": str(Path(config[TRIALS_KEY]) / trial_id / "staging")}
    serve_trial(desks, job)


def concurrent_trials(the_plan: Plan, resources: dict[str, float], cap: int | None = None) -> int:
    """How many trial gangs fit the live cluster at once (at least 1, at most `cap`)."""
    fits = []
    for key, per_worker in the_plan.resources_per_worker.items():
        gang = per_worker * the_plan.workers
        fits.append(math.floor(resources.get(key, 0.0) / gang + 1e-9))
    limit = max(1, min(fits))
    return min(limit, cap or limit)


def search_algorithm(cfg: SweepConfig, concurrency: int):
    """The search, limited to `concurrency` trials at once. The limit must be here: Tune's own
    max_concurrent_trials is ignored for the random/grid generator, and since trial drivers hold no
    resources, every trial would start and wait on the others' GPUs/CPUs (Train gives up after 60 s)."""
    if cfg.search == "optuna":
        from ray.tune.search import ConcurrencyLimiter
        from ray.tune.search.optuna import OptunaSearch

        optuna = OptunaSearch(metric=cfg.metric, mode=cfg.mode, seed=cfg.base.train.seed)
        return ConcurrencyLimiter(optuna, max_concurrent=concurrency)
    from ray.tune.search.basic_variant import BasicVariantGenerator

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


def callbacks(cfg: SweepConfig, sweep_dir: Path, quiet: bool) -> list[tune.Callback]:
    # A gang's placement group lives as long as the sweep; a trial's own group is reaped when it stops.
    reap: list[tune.Callback] = [] if cfg.on_gangs else [ReapPlacementGroups(registry_name(sweep_dir))]
    return reap if quiet else [*reap, LiveTrialTable(cfg.metric, cfg.mode, cfg.base.train.epochs)]


def registry_name(sweep_dir: Path) -> str:
    return f"orchestrator-pg-registry-{sweep_dir.name}"


def make_tuner(cfg: SweepConfig, sweep_dir: Path, concurrency: int | None, quiet: bool = False) -> tune.Tuner:
    """A new Tuner running `concurrency` trials at once, or (concurrency None) the sweep's saved one."""
    # Tune refuses an all-zero request; 1 MiB of `memory` (a resource every node has) with 0 CPU keeps the
    # trial driver from taking a CPU its own workers need, which would deadlock a 2-CPU machine.
    trainable = tune.with_resources(trial_on_gang if cfg.on_gangs else trial_driver, {"cpu": 0, "memory": 2**20})
    if concurrency is None:
        return tune.Tuner.restore(str(sweep_dir), trainable=trainable, resume_unfinished=True,
                                  resume_errored=True)
    base = cfg.base.model_copy(update={"quiet": True})
    return tune.Tuner(
        trainable,
        param_space={**tune_space(cfg), BASE_KEY: base.model_dump(mode="json"),
                     TRIALS_KEY: str(sweep_dir / "trials"), REGISTRY_KEY: registry_name(sweep_dir),
                     DESKS_KEY: desk_prefix(sweep_dir.name)},
        tune_config=tune.TuneConfig(
            metric=cfg.metric, mode=cfg.mode, num_samples=cfg.num_samples,
            search_alg=search_algorithm(cfg, concurrency),
            scheduler=scheduler(cfg), time_budget_s=cfg.time_budget_s,
            reuse_actors=cfg.on_gangs,  # a gang trial's actor is a light relay: keep it for the next trial
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
    launch = trial_config(best.config).model_copy(update={"name": None, "quiet": False})
    return launch, float(best_value)


def run_sweep(cfg: SweepConfig, the_plan: Plan, sweep_dir: Path, resume: bool = False,
              quiet: bool = False) -> SweepResult:
    """Run the sweep on the connected Ray; `the_plan` is the base launch's, checked by the caller."""
    started = time.perf_counter()
    # Every trial checkpoints each epoch by design, so Tune's "snapshotting triggered multiple times" warning
    # would repeat all sweep long.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    concurrency = concurrent_trials(the_plan, ray.cluster_resources(), cfg.max_concurrent_trials)
    log.info("running up to %d trial(s) at once%s", concurrency, " on warm worker groups" if cfg.on_gangs else "")
    with trial_workers(cfg, the_plan, sweep_dir, concurrency):
        results = make_tuner(cfg, sweep_dir, None if resume else concurrency, quiet).fit()
    best, value = best_of(cfg, results)
    return SweepResult(sweep_dir.name, sweep_dir, best, value, time.perf_counter() - started, results,
                       None if resume else concurrency)


@contextlib.contextmanager
def trial_workers(cfg: SweepConfig, the_plan: Plan, sweep_dir: Path, concurrency: int) -> Iterator[None]:
    """What trials run on, for the length of the sweep: the gangs, or the registry of per-trial groups."""
    if cfg.on_gangs:
        # Each trial may cost a gang one restart (a worker that died); more, and the gang gives up.
        with gangs(cfg.base, the_plan, sweep_dir, concurrency, max_failures=cfg.num_samples):
            yield
        return
    # Named, owned by this driver: it lives exactly as long as the sweep does.
    registry = PlacementGroupRegistry.options(name=registry_name(sweep_dir)).remote()
    ray.get(registry.pop.remote())  # wait until it is up before any trial looks it up
    yield
