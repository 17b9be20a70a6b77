"""SweepConfig: the base launch, a search space over launch/train settings, the objective, the search
algorithm and the scheduler. Validated like every other config; `orchestrator sweep --schema` exports it."""

from __future__ import annotations

import difflib
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from orchestrator.config import RUN_NAME, USER_PREFIX, LaunchConfig
from trainables.config import SEARCHED, Flag, TrainConfig
from trainables.metrics import LOOP_METRICS

# What Tune adds to every report (ray.tune.result's): a metric of any trial
TUNE_METRICS = frozenset({"training_iteration", "time_total_s", "time_this_iter_s", "time_since_restore"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # a finite number where one is meant


class _Range(_Strict):
    """A distribution over [low, high); subclasses give the bounds their types."""

    @model_validator(mode="after")
    def _ordered(self) -> _Range:
        if not self.low < self.high:  # type: ignore[attr-defined]
            raise ValueError(f"low({self.low}) must be < high({self.high})")  # type: ignore[attr-defined]
        return self


class Uniform(_Range):
    type: Literal["uniform"]
    low: float
    high: float


class LogUniform(Uniform):
    type: Literal["loguniform"]  # type: ignore[assignment]

    @model_validator(mode="after")
    def _positive(self) -> LogUniform:
        if self.low <= 0:
            raise ValueError(f"loguniform needs low > 0, got {self.low}")
        return self


class RandInt(_Range):
    type: Literal["randint"]
    low: int
    high: int = Field(description="exclusive, as in Python's range")


class Choice(_Strict):
    type: Literal["choice", "grid"]  # grid: every value is run (times num_samples)
    values: list[Any] = Field(min_length=1)


Param = Annotated[Uniform | LogUniform | RandInt | Choice, Field(discriminator="type")]


class Scheduler(_Strict):
    type: Literal["fifo", "asha", "pbt"] = "fifo"
    grace_period: int = Field(1, ge=1, description="ASHA: reports before a trial may be stopped")
    reduction_factor: float = Field(2.0, gt=1)
    perturbation_interval: int = Field(1, ge=1, description="PBT: reports between exploit/explore")


class SweepConfig(_Strict):
    name: str | None = Field(None, description="sweep folder under sweeps/; default: sweep-<time>")
    base: LaunchConfig = Field(default_factory=LaunchConfig)
    space: dict[str, Param] = Field(min_length=1, description="setting name (or user.NAME, one of your own)"
                                    " -> distribution")
    metric: str = "val_acc"
    mode: Literal["max", "min"] = "max"
    num_samples: int = Field(8, ge=1)
    search: Literal["random", "optuna"] = "random"
    scheduler: Scheduler = Field(default_factory=Scheduler)
    time_budget_s: float | None = Field(None, gt=0)
    max_concurrent_trials: int | None = Field(None, ge=1, description="default: as many as the cluster fits")
    reuse_workers: Flag = Field(True, description="run trials on worker groups kept up for the whole sweep"
                                " (when the space changes only train settings); false: a new group per trial")

    @classmethod
    def model_validate(cls, obj: Any, *, context: dict[str, Any] | None = None, **kwargs: Any) -> SweepConfig:
        """Validated with the space's keys as context: the base may hold a setting that acts only with one the
        space searches (powersgd_rank, with grad_compression searched); each trial leaves it out where idle."""
        space = obj.get("space") if isinstance(obj, dict) else None
        searched = {SEARCHED: set(space)} if isinstance(space, dict) else {}
        return super().model_validate(obj, context={**(context or {}), **searched}, **kwargs)

    @model_validator(mode="after")
    def _check(self) -> SweepConfig:
        settable = (set(TrainConfig.model_fields) | set(LaunchConfig.model_fields)) - {"train", "user", "name", "quiet"}
        for key in self.space:
            if key not in settable and not (key.startswith(USER_PREFIX) and len(key) > len(USER_PREFIX)):
                raise ValueError(f"space key {key!r} is not a launch or train setting, nor user.NAME (your own)")
        grids = [k for k, p in self.space.items() if isinstance(p, Choice) and p.type == "grid"]
        if grids and self.search == "optuna":
            raise ValueError(f"grid parameters {grids} cannot be searched by optuna: use search: random")
        if self.base.kind == "script":
            raise ValueError("a sweep runs the shared loop or an entry function; a torchrun script cannot be"
                             " swept yet: wrap its training in a train function (--entry)")
        if self.name is not None and not RUN_NAME.match(self.name):
            raise ValueError(f"{self.name!r} is not a sweep name: letters, digits, '.', '_' or '-'")
        return self

    @field_validator("metric")
    @classmethod
    def _reported(cls, metric: str, info: ValidationInfo) -> str:
        """A metric the shared loop reports (an entry function's own are its to name)."""
        base = info.data.get("base")  # validated before the metric, absent where it failed
        if base is not None and base.kind == "loop":
            known = LOOP_METRICS | TUNE_METRICS
            if metric not in known:
                close = difflib.get_close_matches(metric, known, n=1)
                hint = f"did you mean {close[0]!r}?" if close else "e.g. val_acc, val_loss, loss, samples_per_s"
                raise ValueError(f"{metric!r} is not a figure the training loop reports: {hint}")
        return metric

    @property
    def trial_shape_varies(self) -> bool:
        """Whether the space changes a launch setting (workers, resources, ...) and not only training ones."""
        launch_only = set(LaunchConfig.model_fields) - set(TrainConfig.model_fields)
        return any(key in launch_only for key in self.space)

    @property
    def on_warm_groups(self) -> bool:
        """Trials run on warm groups (orchestrator.warm)."""
        return self.reuse_workers and not self.trial_shape_varies and self.base.entry is None
