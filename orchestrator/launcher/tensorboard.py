"""The run's rows as TensorBoard scalars in runs/<name>/tb/, written as they arrive (`tensorboard --logdir
runs`): loss, lr, throughput, validation, stragglers and host telemetry, each against the optimizer step.
The writer (torch.utils.tensorboard, ~2 s to import) is made on the first rows, in the thread that polls
them, not on the launch's path to its first step."""

from __future__ import annotations

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
        if self.writer is None:
            try:
                from torch.utils.tensorboard import SummaryWriter  # deferred: 2 s of imports, off the launch's path

                self.writer = SummaryWriter(str(self.folder))
            except (ImportError, OSError) as exc:  # no tensorboard, or no room: the run goes on without
                log.warning("no TensorBoard events (%s: %s): pip install tensorboard", type(exc).__name__, exc)
                self.writer = False
                return
        for row in rows[self.written:]:
            step = int(row.get("step", 0))
            for key, value in row.items():
                if key != "step" and isinstance(value, int | float) and math.isfinite(value):
                    self.writer.add_scalar(key, value, step)
        self.written = len(rows)
        self.writer.flush()

    def close(self) -> None:
        if self.writer:
            self.writer.close()
