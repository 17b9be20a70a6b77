"""The function Ray Train runs on every rank of a worker group of its own. It lives here, where nothing
imports torch: the driver, which pickles it by name, never runs it, and the worker's module (torch, the loop:
~1.5 s of import) is imported on the workers alone."""

from __future__ import annotations

from orchestrator.raytrain.job import WorkerArgs


def train_worker(args: WorkerArgs) -> None:
    from orchestrator.raytrain.worker import run_rank  # on the worker (imports torch): see above

    run_rank(args)
