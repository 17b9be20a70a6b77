"""A run's readable results: metrics.parquet (one row per report) and loss.png."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

METRICS_FILE = "metrics.parquet"
LOSS_PLOT = "loss.png"


def read_rows(run_dir: Path) -> list[dict[str, float]]:
    path = run_dir / METRICS_FILE
    return pq.read_table(path).to_pylist() if path.exists() else []


def dedupe_rows(rows: list[dict[str, float]]) -> list[dict[str, float]]:
    """One train row and one validation row per step: a worker group restarted from a checkpoint replays the
    steps after it, and the replay (the same numbers, the run being deterministic) replaces the first try."""
    latest: dict[tuple[float, bool], dict[str, float]] = {}
    for row in rows:
        latest.pop(key := (row.get("step", 0), row.get("val_loss") is not None), None)
        latest[key] = row
    return sorted(latest.values(), key=lambda r: (r.get("step", 0), r.get("val_loss") is not None))


def write_rows(rows: list[dict[str, float]], run_dir: Path) -> Path:
    path = run_dir / METRICS_FILE
    tmp = path.with_suffix(".tmp")
    columns = list(dict.fromkeys(key for row in rows for key in row))  # from_pylist reads only row 0's keys
    pq.write_table(pa.table({key: [row.get(key) for row in rows] for key in columns}), tmp)
    tmp.replace(path)
    return path


def plot_loss(rows: list[dict[str, float]], run_dir: Path, title: str) -> Path:
    import matplotlib  # deferred: ~1 s to import, paid only once a run or sweep has results to plot

    matplotlib.use("Agg")  # files only, no display; must precede pyplot's import
    import matplotlib.pyplot as plt  # deferred: as matplotlib

    # The loop's validation rows repeat the last train loss; a train function's reports are all its own.
    train = [(r["step"], r["loss"]) for r in rows
             if r.get("loss") is not None and (r.get("val_loss") is None or "report" in r)]
    val = [(r["step"], r["val_loss"]) for r in rows if r.get("val_loss") is not None]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    if train:
        ax.plot(*zip(*train, strict=True), label="train loss (rank 0)")
    if val:
        ax.plot(*zip(*val, strict=True), "o-", label="validation loss")
    ax.set_xlabel("optimizer step (a function's own `step`, else its report's number)")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    path = run_dir / LOSS_PLOT
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
