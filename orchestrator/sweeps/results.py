"""A sweep's readable results: trials.parquet (one row per trial per report, with its hyperparameters),
best.yaml (a launch config for `orchestrator launch --config`), sweep.png (metric vs. step, best so far) and
tb/ (each trial's reports as a TensorBoard run)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pandas as pd

from groundwork.plots import figure
from groundwork.tensorboard import TensorBoardRows
from orchestrator.config import LaunchConfig, write_launch_config
from orchestrator.sweeps.config import SweepConfig

TRIALS_FILE = "trials.parquet"
BEST_FILE = "best.yaml"
PLOT_FILE = "sweep.png"
BOARD_DIR = "tb"
# trials.parquet's columns that are no curve: the trial's settings (param_*) are constant, these say which
# trial and how it ended, or are the x axis (see step_axis) or the time of the report
NOT_CURVES = ("trial", "stopped_early", "error", "training_iteration", "time_total_s")


def trial_rows(cfg: SweepConfig, results: Any) -> pd.DataFrame:
    frames = []
    for result in results:
        frame = reports_of(result)
        if frame is None or frame.empty:
            continue
        frame = frame.copy()
        frame["trial"] = frame["trial_id"] if "trial_id" in frame else result.path.rstrip("/").split("/")[-1]
        for key in cfg.space:
            frame[f"param_{key}"] = result.config.get(key)
        iterations = int(frame["training_iteration"].max())
        # ASHA/PBT stop a trial by not letting it run all its epochs; an error is not an early stop.
        frame["stopped_early"] = result.error is None and iterations < cfg.base.train.epochs
        frame["error"] = str(result.error) if result.error else None
        frames.append(frame)
    keep = ["trial", "training_iteration", "step", "epoch", "loss", "val_loss", "val_acc", "samples_per_s", "lr",
            "train_time_s", "time_total_s", "timestamp", "stopped_early", "error", *[f"param_{k}" for k in cfg.space]]
    keep += [] if cfg.metric in keep else [cfg.metric]  # a train function's own metric
    table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=keep)
    return table[[c for c in keep if c in table.columns]]


def reports_of(result: Any) -> pd.DataFrame | None:
    """A trial's reports. Tune can leave result.json empty for a trial that PBT restored from another
    trial's checkpoint more than once; its progress.csv still holds every row."""
    frame = result.metrics_dataframe
    if frame is None or frame.empty:
        csv = Path(result.path) / "progress.csv"
        frame = pd.read_csv(csv) if csv.exists() and csv.stat().st_size else None
    return frame


def write_results(cfg: SweepConfig, results: Any, best: LaunchConfig, sweep_dir: Path) -> pd.DataFrame:
    table = trial_rows(cfg, results)
    table.to_parquet(sweep_dir / TRIALS_FILE, index=False)
    write_launch_config(best, sweep_dir / BEST_FILE)
    plot_sweep(cfg, table, sweep_dir / PLOT_FILE)
    write_boards(table, sweep_dir / BOARD_DIR)
    return table


def step_axis(table: pd.DataFrame) -> str:
    """Optimizer steps for the shared loop; Tune's report count for a train function that reports no step."""
    return "step" if "step" in table and table["step"].notna().all() else "training_iteration"


def write_boards(table: pd.DataFrame, folder: Path) -> None:
    """Each trial's reports as a TensorBoard run of its own, tb/<trial>/ (`tensorboard --logdir
    sweeps/<name>/tb`), written once the sweep is over; Tune's own TensorBoard logger would write them on
    the sweep's driver at every report, on the CPUs the trials train on (see tuner.callbacks). A resumed
    sweep's are written anew, from all its trials' rows."""
    shutil.rmtree(folder, ignore_errors=True)
    x = step_axis(table)
    curves = [c for c in table.columns if c not in NOT_CURVES and not c.startswith("param_")]
    for trial, rows in table.groupby("trial"):
        board = TensorBoardRows(folder / str(trial))
        board(rows[curves].assign(step=rows[x]).to_dict("records"))
        board.close()


def plot_sweep(cfg: SweepConfig, table: pd.DataFrame, path: Path) -> None:
    x = step_axis(table)
    fig = figure(figsize=(11, 4), dpi=100)
    per_trial, so_far = fig.subplots(1, 2)
    for trial, rows in table.groupby("trial"):
        per_trial.plot(rows[x], rows[cfg.metric], "o-", ms=3, label=str(trial)[-5:])
    per_trial.set(xlabel="optimizer step" if x == "step" else "report", ylabel=cfg.metric, title="every trial")
    ordered = table.sort_values("time_total_s") if "time_total_s" in table else table
    values = ordered[cfg.metric]
    best = values.cummax() if cfg.mode == "max" else values.cummin()
    so_far.plot(range(len(best)), best, "-")
    so_far.set(xlabel="reports received", ylabel=f"best {cfg.metric}", title="best so far")
    for ax in (per_trial, so_far):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
