"""Run the loop in this process, no Ray: the bare baseline for benchmarks and the reference in tests."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from trainables.checkpoint import load_state, move_checkpoint
from trainables.config import TrainConfig
from trainables.context import DistContext
from trainables.run import run_training


class LocalReporter:
    """Keeps logged rows in memory and checkpoints as numbered folders under `folder`."""

    def __init__(self, folder: str | Path | None = None) -> None:
        self.rows: list[dict[str, float]] = []
        self.folder = Path(folder) if folder else None
        self.checkpoints: list[Path] = []

    def log(self, row: dict[str, float]) -> None:
        self.rows.append(dict(row))

    def checkpoint(self, metrics: dict[str, float], folder: str | None,
                   finish: Callable[[], None] | None = None) -> None:
        if finish is not None:
            finish()  # kept in a local folder, nothing to overlap with: the background write is waited for
        if folder is None or self.folder is None:
            return
        dest = self.folder / f"checkpoint_{len(self.checkpoints):06d}"
        self.checkpoints.append(move_checkpoint(folder, dest))

    def progress(self, step: int) -> None:
        pass  # one process: no one else to tell it is alive

    def preemption_notice(self) -> bool:
        return False  # no cluster to reclaim a node


def train_locally(cfg: TrainConfig, folder: str | Path | None = None, resume: str | Path | None = None,
                  device: str = "cpu", user: Mapping[str, Any] | None = None) -> tuple[dict[str, float], LocalReporter]:
    reporter = LocalReporter(folder)
    saved = load_state(resume) if resume else None
    metrics = run_training(cfg, DistContext(devices=(torch.device(device),)), reporter, saved, folder, user)
    return metrics, reporter
