"""Train a PyTorch model on a laptop, one GPU box or many nodes with Ray Train, and sweep it with Ray Tune."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orchestrator.auth import present_token

present_token()  # before the user's `import ray`, which reads it

if TYPE_CHECKING:
    from orchestrator.launcher import RunResult

__all__ = ["launch", "sweep"]


def launch(config: str | None = None, resume: str | None = None, **settings: Any) -> RunResult:
    """See orchestrator.api.launch. Imported lazily so `import orchestrator` stays cheap."""
    from orchestrator.api import launch as _launch

    return _launch(config, resume, **settings)


def sweep(config: Any = None, resume: str | None = None, quiet: bool = False) -> Any:
    """See orchestrator.sweeps.api.sweep: run or resume a sweep, return its SweepResult."""
    from orchestrator.sweeps.api import sweep as _sweep

    return _sweep(config, resume, quiet)
