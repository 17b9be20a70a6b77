"""The run's rows as TensorBoard scalars in runs/<name>/tb/, written as they arrive (`tensorboard --logdir
runs`): loss, lr, throughput, validation, stragglers and host telemetry, each against the optimizer step.
The writer (torch.utils.tensorboard, ~2 s to import) is made on the first rows, in the thread that polls
them, not on the launch's path to its first step."""

from __future__ import annotations

import contextlib
import logging
import math
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class TensorBoardRows:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.writer: Any = None
        self.written = 0

    def __call__(self, rows: list[dict[str, Any]]) -> None:
        if self.writer is False:
            return
        try:
            if self.writer is None:
                from torch.utils.tensorboard import SummaryWriter  # deferred: 2 s of imports, off the launch's path

                self.writer = SummaryWriter(str(self.folder))
            for row in rows[self.written:]:
                step = int(row.get("step", 0))
                for key, value in row.items():
                    if key != "step" and isinstance(value, int | float) and math.isfinite(value):
                        self.writer.add_scalar(key, value, step)
            self.written = len(rows)
            self.writer.flush()
        except Exception as exc:  # no tensorboard, a full disk: the run goes on, its rows are in metrics.parquet
            log.warning("TensorBoard events stopped (%s: %s)", type(exc).__name__, str(exc)[:200])
            self.writer = False

    def close(self) -> None:
        if self.writer:
            with contextlib.suppress(Exception):  # (as above)
                self.writer.close()
