"""The Python API mirrors the CLI: `orchestrator.launch(model="digits-cnn", workers=2, epochs=3)`."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from cluster.yamlio import validation_message
from orchestrator.config import LaunchConfig, load_launch_config
from orchestrator.launcher import RunResult, merge, resumed_config
from orchestrator.launcher import launch as launch_config
from trainables.config import TrainConfig
from trainables.errors import ConfigError


def split_overrides(flat: dict[str, Any]) -> dict[str, Any]:
    """Route flat keyword arguments to TrainConfig or LaunchConfig fields; unknown ones are errors."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        if key in TrainConfig.model_fields:
            out.setdefault("train", {})[key] = value
        elif key in LaunchConfig.model_fields and key != "train":
            out[key] = value
        else:
            raise ConfigError(f"unknown setting {key!r}: see `orchestrator launch --help` for the settings")
    return out


def build_config(overrides: dict[str, Any], config_file: str | None = None,
                 resume: str | None = None) -> LaunchConfig:
    try:
        if resume:
            return resumed_config(resume, {**overrides, "name": resume}, overrides.get("cluster"))
        base = load_launch_config(config_file) if config_file else LaunchConfig()
        return merge(base, overrides)
    except ValidationError as exc:
        raise ConfigError(validation_message(exc, None, "settings")) from None


def launch(config: str | None = None, resume: str | None = None, **settings: Any) -> RunResult:
    """Train to the end and return the run's folder, last validation metrics and latest checkpoint.

    `config` is a launch YAML (e.g. a sweep's best.yaml); `resume` the name of a run to continue;
    every other keyword is a TrainConfig or LaunchConfig field."""
    cfg = build_config(split_overrides(settings), config, resume)
    return launch_config(cfg, resume=resume is not None)
