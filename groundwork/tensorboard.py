"""Rows as TensorBoard scalars, each against its optimizer step: a run's in runs/<name>/tb/, written as they
arrive (`tensorboard --logdir runs`: loss, lr, throughput, validation, stragglers and host telemetry), and
each trial's of a sweep in sweeps/<name>/tb/<trial>/ at its end. The writer is TensorBoard's own event-file
writer with scalar summaries, as torch.utils.tensorboard's add_scalar writes them, without importing torch
(the driver of a launch on a pool never does); it is made on the first rows, in the thread that writes them."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

WRITER_MODULE = "tensorboard.summary.writer.event_file_writer"  # what the writer imports (~0.2 s)
WALL_TIME = "timestamp"  # a row's epoch seconds where it has them (a sweep's, Tune's): the event's time


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
                from tensorboard.summary.writer.event_file_writer import EventFileWriter  # see WRITER_MODULE

                self.writer = EventFileWriter(str(self.folder))
            for row in rows[self.written:]:
                self.writer.add_event(scalars_event(row))
            self.written = len(rows)
            self.writer.flush()
        except Exception as exc:  # no tensorboard, a full disk: the run goes on, its rows are in metrics.parquet
            log.warning("TensorBoard events stopped (%s: %s)", type(exc).__name__, str(exc)[:200])
            self.writer = False

    def close(self) -> None:
        if self.writer:
            with contextlib.suppress(Exception):  # (as above)
                self.writer.close()


def scalars_event(row: dict[str, Any]) -> Any:
    """One event holding the row's finite numbers as scalars at its step (at its WALL_TIME, else now)."""
    from tensorboard.compat.proto import event_pb2, summary_pb2  # deferred, as the writer

    values = [summary_pb2.Summary.Value(tag=key, simple_value=value) for key, value in row.items()
              if key not in ("step", WALL_TIME) and isinstance(value, int | float) and math.isfinite(value)]
    summary = summary_pb2.Summary(value=values)
    return event_pb2.Event(wall_time=float(row.get(WALL_TIME) or time.time()), step=int(row.get("step", 0)),
                           summary=summary)
