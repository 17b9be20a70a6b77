"""The Python API mirrors the CLI: `orchestrator.launch(model="digits-cnn", workers=2, epochs=3)` and
`orchestrator.sweep("sweep.yaml")`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.config import resolve_launch, split_overrides
from orchestrator.launcher.launch import RunResult
from orchestrator.launcher.launch import launch as launch_run
from orchestrator.sweeps.config import SweepConfig
from orchestrator.sweeps.sweep import sweep as run_sweep
from orchestrator.sweeps.tuner import SweepResult


def launch(config: str | None = None, resume: str | None = None, **settings: Any) -> RunResult:
    """Train to the end and return the run's folder, last validation metrics and latest checkpoint.

    `config` is a launch YAML (e.g. a sweep's best.yaml); `resume` the name of a run to continue;
    every other keyword is a TrainConfig or LaunchConfig field."""
    cfg = resolve_launch(split_overrides(settings), config, resume)
    return launch_run(cfg, resume=resume is not None)


def sweep(config: str | Path | SweepConfig | None = None, resume: str | None = None,
          quiet: bool = False) -> SweepResult:
    """Run (or, with resume=NAME, continue) a sweep and write its results."""
    return run_sweep(config, resume, quiet)
