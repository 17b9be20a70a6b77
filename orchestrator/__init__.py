"""Train a PyTorch model on a laptop, one GPU box or many nodes with Ray Train, and sweep it with Ray Tune."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.raytrain.auth import present_token
from orchestrator.raytrain.reports import report

present_token()  # before the user's `import ray`, which reads it

if TYPE_CHECKING:
    from orchestrator.launcher.launch import RunResult
    from orchestrator.sweeps.tuner import SweepResult

__all__ = ["launch", "report", "sweep"]


def launch(config: str | None = None, resume: str | None = None, **settings: Any) -> RunResult:
    """See orchestrator.api.launch."""
    from orchestrator.api import launch as _launch  # deferred: `import orchestrator` stays cheap (no Ray, torch)

    return _launch(config, resume, **settings)


def sweep(config: Any = None, resume: str | None = None, quiet: bool = False) -> SweepResult:
    """See orchestrator.api.sweep: run or resume a sweep, return its SweepResult."""
    from orchestrator.api import sweep as _sweep  # deferred: `import orchestrator` stays cheap (no Ray, torch)

    return _sweep(config, resume, quiet)
