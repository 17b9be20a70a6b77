"""Where a run's rows go as they arrive, besides the bar: TensorBoard events in runs/<name>/tb/ always, MLflow
with --mlflow. One context for a launch on its own group and on a pool; MLflow is told how the run ended."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from groundwork.errors import Interrupted
from groundwork.tensorboard import TensorBoardRows
from orchestrator.config import LaunchConfig
from orchestrator.launcher.mlflow_rows import MlflowRows

Rows = Callable[[list[dict]], None]


def both(*calls: Rows | None) -> Rows:
    """Rows to each of several consumers (the bar, TensorBoard, MLflow)."""
    def call(rows: list[dict]) -> None:
        for consumer in calls:
            if consumer is not None:
                consumer(rows)
    return call


@contextlib.contextmanager
def trackers(cfg: LaunchConfig, run_dir: Path) -> Iterator[Rows]:
    """A consumer of the run's rows for TensorBoard and MLflow, closed with the run's end (MLflow's words)."""
    board, tracking = TensorBoardRows(run_dir / "tb"), MlflowRows(cfg.mlflow, cfg)
    status = "FAILED"
    try:
        yield both(board, tracking)
        status = "FINISHED"
    except (Interrupted, KeyboardInterrupt):
        status = "KILLED"
        raise
    finally:
        board.close()
        tracking.close(status)
