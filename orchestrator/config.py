"""LaunchConfig: a training run's settings (TrainConfig) plus where and how wide it runs.

The same object comes from CLI flags, from `--config FILE` (e.g. a sweep's best.yaml) or from Python, and is
saved as the run's launch.yaml so `--resume NAME` continues with exactly what the run started with.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from cluster.yamlio import read_yaml, validate_doc
from trainables.config import Flag, TrainConfig

RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


class LaunchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    train: TrainConfig = Field(default_factory=TrainConfig)
    workers: int = Field(2, ge=1, description="Ray Train workers (DDP ranks)")
    gpus_per_worker: float = Field(0, ge=0, description="GPUs per worker; a fraction (e.g. 0.5) lets 1-worker"
                                   " jobs, such as sweep trials, share a GPU")
    cpus_per_worker: int | None = Field(None, ge=1, description="default: the node's CPUs shared out")
    placement: Literal["pack", "spread", "strict-pack", "strict-spread"] = "pack"
    node_group: str | None = None
    cluster: str | None = Field(None, description="cluster spec YAML; default: this machine")
    address: str | None = Field(None, description="Ray cluster to join; default: start an embedded local Ray")
    name: str | None = Field(None, description="run folder name; default: <model>-<timestamp>")
    entry: str | None = Field(None, description="module:function run in each worker instead of the shared loop")
    keep_checkpoints: int = Field(2, ge=1)
    max_failures: int = Field(0, ge=0, description="worker-group restarts from the latest checkpoint")
    hang_timeout: float = Field(300.0, gt=0, description="seconds a rank may make no progress before the run"
                                " is ended as hung (first steps and torch.compile count: raise it for them)")
    quiet: Flag = False
    dashboard: Flag = False

    @field_validator("name")
    @classmethod
    def _name(cls, name: str | None) -> str | None:
        if name is not None and not RUN_NAME.match(name):
            raise ValueError(f"{name!r} is not a run name: use letters, digits, '.', '_' or '-' (<= 100 chars)")
        return name

    @field_validator("entry")
    @classmethod
    def _entry(cls, entry: str | None) -> str | None:
        if entry is not None and not re.match(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", entry):
            raise ValueError(f"{entry!r} is not module:function (e.g. mypkg.train:train_func)")
        return entry

    def saved_form(self) -> dict:
        """What launch.yaml holds: everything but the per-invocation display flags."""
        return self.model_dump(mode="json", exclude={"quiet", "dashboard"})


def load_launch_config(path: str | Path) -> LaunchConfig:
    return validate_doc(LaunchConfig, read_yaml(path))


def write_launch_config(cfg: LaunchConfig, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(cfg.saved_form(), sort_keys=False))
    tmp.replace(path)  # atomic: a reader never sees half a file
