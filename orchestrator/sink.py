"""A tiny Ray actor that carries rank 0's metric rows to the driver while training runs.

Rows go out fire-and-forget (`push.remote`) so logging never blocks a training step, and the driver polls
`since(n)` for the progress bar and writes them all to metrics.parquet at the end. It works across nodes,
where a file in a node-local run folder would not.
"""

from __future__ import annotations

import ray


@ray.remote(num_cpus=0)
class MetricsSink:
    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []

    def push(self, row: dict[str, float]) -> None:
        self.rows.append(row)

    def since(self, start: int) -> list[dict[str, float]]:
        return self.rows[start:]
