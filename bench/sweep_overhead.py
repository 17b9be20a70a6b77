"""How much of a sweep's wall time the trials spend training: warm groups (the default)
vs a fresh Ray Train run per trial, side by side in one run.

Runs a sweep (default: tests/data/sweeps/asha_digits.yaml, 8 ASHA trials of 2 workers on this machine) once
per mode and prints, for each:
  step fraction  = sum over trials of time inside training steps / (sweep wall time x concurrent trials)
  from the first step on = the same, without the time before the first step (Ray, workers' start)
  trials/minute, and the seconds before the first step
Everything outside the steps is overhead: Ray and worker-group start, process-group init, data loading,
validation, checkpoints, Tune bookkeeping. Goal: step fraction >= 0.8.

    .venv/bin/python bench/sweep_overhead.py [--config FILE] [--epochs N] [--quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml
from common import log_stamp, provenance, write_result

REPO = Path(__file__).resolve().parent.parent
DEFAULT = REPO / "tests" / "data" / "sweeps" / "asha_digits.yaml"


def first_step_at(sweep_dir: Path) -> float | None:
    """When the sweep's first optimizer step ran (epoch seconds, to the millisecond): the earliest
    "first optimizer step done" line of any rank-0 log (warm groups' and fresh trials' alike)."""
    stamps = [log_stamp(line) for log in sweep_dir.rglob("rank-0.log") for line in log.read_text().splitlines()
              if "first optimizer step done" in line]
    return min(stamps, default=None)


def measure(config: Path, quick: bool, epochs: int | None, reuse: bool) -> dict:
    from orchestrator.sweeps.config import SweepConfig
    from orchestrator.sweeps.sweep import sweep

    cfg = yaml.safe_load(config.read_text())
    if quick:  # CI-sized: 2 trials of 1 epoch
        cfg.update(num_samples=2, name="bench-quick")
        cfg["base"]["train"]["epochs"] = 1
    if epochs:
        cfg["base"]["train"]["epochs"] = epochs
    cfg["name"] = f"{cfg.get('name', 'bench')}-{'warm' if reuse else 'fresh'}-{int(time.time())}"
    cfg["reuse_workers"] = reuse
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # sweeps/ goes here and is deleted after
        started_at, started = time.time(), time.perf_counter()
        result = sweep(SweepConfig.model_validate(cfg), quiet=True)
        wall = time.perf_counter() - started
        trials = pd.read_parquet(result.path / "trials.parquet")
        first_step = first_step_at(result.path)
    in_steps = float(trials.groupby("trial")["train_time_s"].max().sum())
    concurrency = result.concurrency
    if first_step is None:  # no rank log: Tune's stamp of each report (whole seconds), less the steps before it
        first = trials[trials["training_iteration"] == 1]
        first_step = float((first["timestamp"] - first["train_time_s"]).min())
    before_first = max(0.0, first_step - started_at)
    return {
        "mode": "warm" if reuse else "fresh",
        "trials": int(trials["trial"].nunique()),
        "stopped_early": int(trials.groupby("trial")["stopped_early"].first().sum()),
        "concurrent_trials": concurrency,
        "wall_s": round(wall, 2),
        "before_first_step_s": round(before_first, 1),
        "time_in_steps_s": round(in_steps, 2),
        "step_fraction": round(in_steps / (wall * concurrency), 4),
        "step_fraction_after_first_step": round(in_steps / ((wall - before_first) * concurrency), 4),
        "trials_per_minute": round(trials["trial"].nunique() / wall * 60, 2),
        "best_metric": result.best_metric,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=DEFAULT)
    parser.add_argument("--epochs", type=int, help="override the base launch's epochs (longer trials)")
    parser.add_argument("--quick", action="store_true", help="2 one-epoch trials, for CI")
    parser.add_argument("--out", type=Path, help="write the result as JSON here")
    args = parser.parse_args()
    out = args.out.resolve() if args.out else None  # measure() runs in a temp folder
    config = args.config.resolve()
    modes = {m["mode"]: m for m in (measure(config, args.quick, args.epochs, reuse) for reuse in (True, False))}
    rows = [("trials (stopped early)", lambda m: f"{m['trials']} ({m['stopped_early']})"),
            ("trials at once", lambda m: str(m["concurrent_trials"])),
            ("wall time, s", lambda m: f"{m['wall_s']:.1f}"),
            ("before the first step, s", lambda m: f"{m['before_first_step_s']:.0f}"),
            ("time inside steps, s", lambda m: f"{m['time_in_steps_s']:.1f}"),
            ("step fraction (goal >= 0.8)", lambda m: f"{m['step_fraction']:.3f}"),
            ("  from the first step on", lambda m: f"{m['step_fraction_after_first_step']:.3f}"),
            ("trials per minute", lambda m: f"{m['trials_per_minute']:.2f}")]
    print(f"{'':<30}{'warm':>10}{'fresh':>10}")
    for label, show in rows:
        print(f"{label:<30}{show(modes['warm']):>10}{show(modes['fresh']):>10}")
    speedup = modes["warm"]["trials_per_minute"] / modes["fresh"]["trials_per_minute"]
    print(f"trials per minute, warm groups / fresh: {speedup:.2f}")
    warm = modes["warm"]
    write_result({
        "config": str(config.relative_to(REPO)) if config.is_relative_to(REPO) else str(config),
        "quick": args.quick, "epochs": args.epochs,
        # the headline numbers are the default mode's (warm groups); both modes in full under "modes"
        "trials": warm["trials"], "wall_s": warm["wall_s"], "step_fraction": warm["step_fraction"],
        "trials_per_minute": warm["trials_per_minute"], "warm_over_fresh_trials_per_minute": round(speedup, 2),
        "modes": modes, "cpus": os.cpu_count(), **provenance(),
    }, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
