"""One-worker sweep trials sharing a GPU by fraction (gpus_per_worker 0.5): how many ran at once, each
trial's span (on warm groups: from the groups' logs), and that no placement group is left afterwards. Needs a GPU.

    python3 bench/sweep_gpu_share.py --out bench/results/sweep_gpu_share_h200.json
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from pathlib import Path

from common import log_stamp, provenance, write_result

import orchestrator

CONFIG = Path(__file__).resolve().parent / "sweeps" / "gpu_share.yaml"


def most_at_once(spans: list[tuple[float, float]]) -> int:
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = peak = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    return peak


def warm_spans(sweep_dir: Path) -> list[tuple[float, float]]:
    """Each trial's span on its warm group, to the millisecond, from the group's log lines that start and end it
    ("job ID: rank 0 of ...", "job ID ended (done) after ..."). Tune's stamps are whole seconds, too coarse here."""
    starts: dict[str, float] = {}
    spans = []
    for log in sweep_dir.glob("warm-groups/group-*/logs/rank-0.log"):
        for line in log.read_text().splitlines():
            found = re.search(r"orchestrator\.warm: job (\S+?)(:| ended)", line)
            if found and found.group(2) == ":":
                starts[found.group(1)] = log_stamp(line)
            elif found:
                spans.append((starts[found.group(1)], log_stamp(line)))
    return spans


def tune_spans(results) -> list[tuple[float, float]]:
    spans = []
    for trial in results:
        frame = trial.metrics_dataframe
        first = frame.iloc[0]
        spans.append((float(first["timestamp"] - first["time_total_s"]), float(frame["timestamp"].max())))
    return spans


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    out = args.out.resolve() if args.out else None
    import ray

    from cluster.spec import load_spec
    from orchestrator.raytrain.session import start_local

    os.chdir(tempfile.mkdtemp())
    start_local(load_spec())  # held here, so the sweep reuses it and we can look afterwards
    result = orchestrator.sweep(CONFIG, quiet=True)
    warm = warm_spans(result.path)
    spans = warm or tune_spans(result.results)
    left = [g for g in ray.util.placement_group_table().values() if g["state"] != "REMOVED"]
    report = {"mode": "warm groups" if warm else "fresh",
              "trials": len(spans), "planned_concurrency": result.concurrency, "most_at_once": most_at_once(spans),
              "trial_spans_s": [round(end - start, 1) for start, end in spans],
              "best_val_acc": result.best_metric, "placement_groups_left": len(left),
              "gpu": ray.cluster_resources().get("GPU"), "sweep_wall_s": round(result.seconds, 1),
              **provenance()}
    ray.shutdown()
    print(report)
    write_result(report, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
