"""A run's readable results: metrics.parquet (one row per report), loss.png, and gpu.png (host.png on CPU):
the telemetry columns over the steps."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from groundwork.plots import figure

METRICS_FILE = "metrics.parquet"
LOSS_PLOT = "loss.png"
# (column, what the panel shows): the telemetry plotted per step, where the rows have it
GPU_PANELS = (("gpu_util_pct_mean", "GPU utilisation %, mean of ranks"),
              ("gpu_mem_mib_max", "GPU memory used (MiB), fullest GPU"),
              ("gpu_power_w_mean", "GPU power (W), mean of ranks"),
              ("allreduce_share_mean", "share of wall time in all-reduce, mean of ranks"))
HOST_PANELS = (("cpu_pct_mean", "CPU % per rank (100 = one core), mean"),
               ("rss_mib_max", "resident memory (MiB), largest rank"),
               ("allreduce_share_mean", "share of wall time in all-reduce, mean of ranks"))


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
    # The loop's validation rows repeat the last train loss; a train function's reports are all its own.
    train = [(r["step"], r["loss"]) for r in rows
             if r.get("loss") is not None and (r.get("val_loss") is None or "report" in r)]
    val = [(r["step"], r["val_loss"]) for r in rows if r.get("val_loss") is not None]
    fig = figure(figsize=(7, 4), dpi=100)
    ax = fig.subplots()
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
    return path


def plot_telemetry(rows: list[dict[str, float]], run_dir: Path, title: str) -> Path | None:
    """gpu.png (host.png for a CPU run): one panel per telemetry column the train rows hold; None if none."""
    train = [r for r in rows if r.get("val_loss") is None]
    gpu = any("gpu_util_pct_mean" in r for r in train)
    panels = [(key, label) for key, label in (GPU_PANELS if gpu else HOST_PANELS)
              if any(r.get(key) is not None for r in train)]
    if not panels:
        return None
    fig = figure(figsize=(7, 2.2 * len(panels)), dpi=100)
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)
    for ax, (key, label) in zip(axes[:, 0], panels, strict=True):
        ax.plot(*zip(*[(r["step"], r[key]) for r in train if r.get(key) is not None], strict=True), ".-")
        ax.set_title(label, fontsize=9)
        ax.ticklabel_format(axis="y", useOffset=False, style="plain")
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("optimizer step")
    fig.suptitle(title)
    path = run_dir / ("gpu.png" if gpu else "host.png")
    fig.tight_layout()
    fig.savefig(path)
    return path
