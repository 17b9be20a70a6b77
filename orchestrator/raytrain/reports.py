"""A report of a user's own code (a `--entry` function's `ray.train.report`, a script's `orchestrator.report`)
made into a row of the run, and the pipe that carries a script's reports to its worker.

This module imports neither Ray nor torch: `orchestrator.report` runs inside the user's script, which may run
under plain torchrun (there it does nothing)."""

from __future__ import annotations

import json
import math
import os
from typing import Any

from groundwork.errors import NonFiniteLoss

REPORT_FD = "ORCHESTRATOR_REPORT_FD"  # set in a script's environment: the pipe its reports go down


def numbers(metrics: dict[str, Any]) -> dict[str, float]:
    """The numeric values of a report (Python numbers, numpy and 0-d torch scalars), as floats."""
    out = {}
    for key, value in metrics.items():
        if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
            value = value.item()
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = float(value)
    return out


def report(metrics: dict[str, Any]) -> None:
    """From a script launched by `orchestrator launch --script`: a row of the run (metrics.parquet, loss.png,
    RunResult.metrics) from rank 0's reports; every rank's report is progress for the hang watchdog. A `step`
    key is the row's step (else the report's number); a nan/inf `loss` ends the run. Under plain torchrun (or
    python) it does nothing."""
    fd = os.environ.get(REPORT_FD)
    if fd is not None:
        os.write(int(fd), (json.dumps(numbers(metrics)) + "\n").encode())


class ReportRows:
    """Numbers a user's reports and turns each into a row; the loop's nan check applies to its `loss`."""

    def __init__(self, reports: int = 0) -> None:
        self.reports = reports

    def row(self, metrics: dict[str, Any]) -> dict[str, float]:
        """The next report's row; raises NonFiniteLoss for a nan/inf loss (before anything is kept of it)."""
        self.reports += 1
        row = {**numbers(metrics), "report": float(self.reports)}
        row.setdefault("step", float(self.reports))  # the code's own step, else the report's number
        loss = row.get("loss")
        if loss is not None and not math.isfinite(loss):
            raise NonFiniteLoss(int(row["step"]))
        return row
