"""How much of a sweep's wall time the trials spend training.

Runs a sweep (default: tests/data/sweeps/asha_digits.yaml, 8 ASHA trials of 2 workers on this machine) and
prints, from one run:
  step fraction = sum over trials of time inside training steps / (sweep wall time x concurrent trials)
  trials/minute
Everything outside the steps is overhead: Ray worker-group start, process-group init, data loading,
validation, checkpoints, Tune bookkeeping. Goal: step fraction >= 0.8.

    .venv/bin/python bench/sweep_overhead.py [--config FILE] [--quick] [--out bench/results/sweep_overhead.json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml
from common import provenance, write_result

REPO = Path(__file__).resolve().parent.parent
DEFAULT = REPO / "tests" / "data" / "sweeps" / "asha_digits.yaml"


def measure(config: Path, quick: bool) -> dict:
    import os

    from orchestrator.sweeps.api import sweep
    from orchestrator.sweeps.config import SweepConfig

    cfg = yaml.safe_load(config.read_text())
    if quick:  # CI-sized: 2 trials of 1 epoch
        cfg.update(num_samples=2, name="bench-quick")
        cfg["base"]["train"]["epochs"] = 1
    cfg["name"] = f"{cfg.get('name', 'bench')}-{int(time.time())}"
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # sweeps/ goes here and is deleted after
        started = time.perf_counter()
        result = sweep(SweepConfig.model_validate(cfg), quiet=True)
        wall = time.perf_counter() - started
        trials = pd.read_parquet(result.path / "trials.parquet")
    in_steps = float(trials.groupby("trial")["train_time_s"].max().sum())
    concurrency = result.concurrency
    return {
        "config": str(config.relative_to(REPO)) if config.is_relative_to(REPO) else str(config),
        "quick": quick,
        "trials": int(trials["trial"].nunique()),
        "stopped_early": int(trials.groupby("trial")["stopped_early"].first().sum()),
        "concurrent_trials": concurrency,
        "wall_s": round(wall, 2),
        "time_in_steps_s": round(in_steps, 2),
        "step_fraction": round(in_steps / (wall * concurrency), 4),
        "trials_per_minute": round(trials["trial"].nunique() / wall * 60, 2),
        "best_metric": result.best_metric,
        "cpus": os.cpu_count(),
        **provenance(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=DEFAULT)
    parser.add_argument("--quick", action="store_true", help="2 one-epoch trials, for CI")
    parser.add_argument("--out", type=Path, help="write the result as JSON here")
    args = parser.parse_args()
    out = args.out.resolve() if args.out else None  # measure() runs in a temp folder
    result = measure(args.config.resolve(), args.quick)
    print(f"{'trials':>22}: {result['trials']} ({result['stopped_early']} stopped early by the scheduler)")
    print(f"{'wall time':>22}: {result['wall_s']:.1f} s, {result['concurrent_trials']} trial(s) at once")
    print(f"{'time inside steps':>22}: {result['time_in_steps_s']:.1f} s")
    print(f"{'step fraction':>22}: {result['step_fraction']:.3f}   (goal >= 0.8)")
    print(f"{'trials per minute':>22}: {result['trials_per_minute']:.2f}")
    write_result(result, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
