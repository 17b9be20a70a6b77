"""What a driver hands a worker group, typed: a Job (one piece of training: a launch, or a sweep trial) and,
for a worker group of its own, the WorkerArgs around it. Both are pickled across processes as they are; one
shape serves own groups, warm groups and pools alike. No Ray here."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from trainables.checkpoint import checkpoints_in
from trainables.config import TrainConfig

# "loop": the shared training loop on `train`; "function": the user's `entry(config)` in every worker;
# "script": a torchrun script, one child process per worker (orchestrator.raytrain.script).
JobKind = Literal["loop", "function", "script"]


@dataclass(frozen=True)
class Job:
    """One job: a launch is one, a sweep trial is one."""

    name: str  # the run's name, or the sweep trial's id
    train: TrainConfig
    kind: JobKind = "loop"
    entry: str | None = None  # kind "function": module:function
    run_dir: str | None = None  # the job's folder: checkpoints found there on a restart, profile traces
    log_dir: str | None = None  # each rank logs to <log_dir>/rank-N.log; None: the worker group's own logs
    resume: tuple[str, ...] = ()  # checkpoint folders to resume from, newest first: the first complete one wins
    user: dict[str, Any] = field(default_factory=dict)  # the user's own settings (`user:`, --set)
    sampled: dict[str, Any] = field(default_factory=dict)  # a sweep trial's sampled settings, for its logs
    command: tuple[str, ...] = ()  # kind "script": python's arguments: (path, *args) or ("-m", module, *args)
    cwd: str | None = None  # kind "script": where it runs (the folder the launch came from)
    tee: bool = False  # kind "script": every rank's output to the terminal, not only rank 0's
    max_restarts: int = 0  # kind "script": TORCHELASTIC_MAX_RESTARTS
    planned_world: int = 0  # the worker count `train`'s batch settings are for (an elastic run may have fewer)
    remote: str | None = None  # the run folder's URI where storage.path is one; run_dir is then its staging copy

    def __post_init__(self) -> None:
        if (self.kind == "function") != (self.entry is not None) or (self.kind == "script") != bool(self.command):
            raise ValueError(f"job {self.name}: kind {self.kind!r} with entry {self.entry!r}, command"
                             f" {self.command!r}")

    @property
    def controller_in_driver(self) -> bool:
        """Whether Ray Train's controller runs in the driver rather than an actor of its own (see
        orchestrator.raytrain.embedded.EmbeddedController): a train function may ask it for the run's
        checkpoints (`ray.train.get_all_reported_checkpoints`, through its actor handle); the shared loop and
        a script never do."""
        return self.kind != "function"

    @property
    def staging(self) -> Path:
        """Where a warm group's rank 0 copies each checkpoint for the job's client to take."""
        if self.run_dir is None:
            raise ValueError(f"job {self.name} has no run_dir to stage checkpoints in")
        return Path(self.run_dir) / ".staging"

    def checkpoint_folders(self, latest: Path | None) -> list[Path]:
        """Where a (re)start of this job on a group of its own looks for a checkpoint, newest first: Ray's
        latest, then the run folder's own (a checkpoint written just before a worker died is complete but
        may be unknown to Ray, whose controller learns of a report only when it next polls; a --resume
        finds the run's there). A run folder holds only its own run's checkpoints."""
        on_disk = checkpoints_in(self.run_dir) if self.run_dir else [Path(p) for p in self.resume]
        return on_disk if latest is None or latest in on_disk else [latest, *on_disk]

    def user_config(self) -> dict[str, Any]:
        """What a kind "function" job's entry gets (Ray Train's `train_func(config)` convention): only the
        user's own settings, so `config.get("lr", 1e-2)` keeps the function's default, plus `run_dir`."""
        return {**self.user, "run_dir": self.run_dir}


@dataclass(frozen=True)
class WorkerArgs:
    """Every rank's argument on a worker group of its own (orchestrator.raytrain.entry.train_worker)."""

    job: Job
    sink: Any = None  # the run's MetricsSink actor: rows and heartbeats to the driver; None: neither
    on_start: Callable[[], None] | None = None  # called by rank 0 first (a sweep registers the placement group)


def takes_config(fn: Callable[..., Any]) -> bool | None:
    """Whether a train function takes its config dict (True) or nothing (False), as TorchTrainer allows;
    None when it can be called neither way."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    required = [p for p in params if p.default is inspect.Parameter.empty
                and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    if any(p.kind is inspect.Parameter.KEYWORD_ONLY for p in required) or len(required) > 1:
        return None
    return len(required) == 1


def resolve_entry(entry: str) -> Callable[[dict[str, Any]], Any]:
    module, _, func = entry.partition(":")
    return getattr(importlib.import_module(module), func)
