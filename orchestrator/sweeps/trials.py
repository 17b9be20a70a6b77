"""What one Tune trial runs: its launch is the sweep's base with the trial's sampled settings on top, and it
runs as one Job, either on one of the sweep's warm groups (orchestrator.warm: the trial is the job's client)
or as a Ray Train run of its own (Ray 2.60's Train V2 pattern: a Tune function trial builds and fits a
TorchTrainer, whose reports reach Tune through TuneReportCallback)."""

from __future__ import annotations

import functools
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray import tune
from ray.tune.integration.ray_train import TuneReportCallback

from orchestrator.config import LaunchConfig, leaving_out_idle, merge, split_overrides
from orchestrator.preflight import checked_plan
from orchestrator.raytrain.entry import train_worker
from orchestrator.raytrain.job import Job, WorkerArgs
from orchestrator.raytrain.trainer import make_trainer
from orchestrator.sweeps.reaper import register_current_group
from orchestrator.warm.client import serve


@dataclass(frozen=True)
class TrialContext:
    """What every trial of a sweep shares. Tune hands it to each trial (tune.with_parameters); the search
    space holds only what is searched."""

    base: LaunchConfig
    trials_dir: str  # trial T keeps its files in <trials_dir>/<T>
    registry: str  # own-group trials: the named actor they register their placement groups with
    desk_prefix: str  # warm-group trials: the names of the sweep's desks start with it


def trial_launch(base: LaunchConfig, sampled: dict[str, Any]) -> LaunchConfig:
    """A trial's launch: the base with this trial's sampled values on top, less the settings that do nothing
    in this trial (a space over grad_compression, say, with powersgd_rank among its values: the others'
    trials leave it at its default, as a launch of them would have to)."""
    return merge(base, leaving_out_idle(base, split_overrides(sampled), keep_given=False))


def trial_on_own_group(config: dict[str, Any], context: TrialContext) -> None:
    """One Tune trial = one full Ray Train run of the trial's job; metrics reach Tune through
    TuneReportCallback, and rank 0 registers the placement group so the sweep can reap it (see reaper)."""
    cfg = trial_launch(context.base, config)
    _, the_plan, _ = checked_plan(cfg)
    trial_id = tune.get_context().get_trial_id()
    run_dir = Path(context.trials_dir) / trial_id
    job = Job(name=trial_id, train=cfg.train, kind="function" if cfg.entry else "loop", entry=cfg.entry,
              run_dir=str(run_dir), log_dir=str(run_dir / "logs"), user=cfg.user, sampled=dict(config))
    args = WorkerArgs(job, on_start=functools.partial(register_current_group, context.registry, trial_id))
    make_trainer(train_worker, args, the_plan, run_dir, keep_checkpoints=cfg.keep_checkpoints,
                 max_failures=cfg.max_failures, callbacks=[TuneReportCallback()], datasets=cfg.datasets).fit()


def report_to_tune(metrics: dict[str, Any], path: str | None) -> None:
    """A warm-group trial's report: tune.report returns when Tune lets the trial go on, and raises SystemExit
    in this thread when Tune stops it (serve's `finally` lets go of the desk)."""
    tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(path) if path else None)
    if path:
        shutil.rmtree(path, ignore_errors=True)  # Tune keeps its own copy


def trial_on_warm_group(config: dict[str, Any], context: TrialContext) -> None:
    """One Tune trial run as a job by one of the sweep's warm groups; its reports reach Tune through here."""
    cfg = trial_launch(context.base, config)
    trial_id = tune.get_context().get_trial_id()
    resume = tune.get_checkpoint()  # set when Tune resumes the trial, or PBT hands it another's weights
    job = Job(name=trial_id, train=cfg.train, run_dir=str(Path(context.trials_dir) / trial_id),
              resume=(resume.path,) if resume else (), user=cfg.user, sampled=dict(config))
    desks = sorted(name for name in ray.util.list_named_actors() if name.startswith(context.desk_prefix))
    # One line per checkpoint from Ray ("Checkpoint successfully created") is noise in a sweep's output.
    logging.getLogger("ray.train").setLevel(logging.WARNING)
    serve(desks, job, report_to_tune)
