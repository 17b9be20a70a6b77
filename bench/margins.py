"""How far the suite's learning thresholds are from failing: each test that asserts a model learned (an
accuracy, a falling loss) is re-run here, in one process, over several seeds, and the worst seed's number is
printed beside the threshold. A threshold that only the test's own seed meets passes by numerical luck and
fails on another processor (as the split-ResNet test at lr 0.1 did): every case here must pass on every seed.

Ray Train runs are replayed as the one-process run with the same global batch (tests/test_ray_train.py proves
the two equal), so this needs no Ray.

    .venv/bin/python bench/margins.py [--seeds 5] [--out bench/results/margins_cpu.json]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from common import provenance, write_result

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]  # the project, and the tests' helpers it replays

from helpers import fit_one_batch  # noqa: E402

from trainables.config import TrainConfig  # noqa: E402
from trainables.data.meta import DataMeta  # noqa: E402
from trainables.local import train_locally  # noqa: E402
from trainables.models import build_model  # noqa: E402
from trainables.parallel.pipeline import Pipeline  # noqa: E402

FAST = {"model": "digits-cnn", "batch_size": 32, "log_every": 5}


def val_acc(**settings) -> Callable[[int], float]:
    return lambda seed: train_locally(TrainConfig(**{**settings, "seed": seed}))[0]["val_acc"]


def gpt_char_drop(seed: int) -> float:
    """tests/test_loop.py::test_gpt_char_learns_stdlib_text: the fall of the loss in 40 steps (needs > 0.6)."""
    cfg = TrainConfig(model="gpt-char", seq_len=64, batch_size=16, max_steps=40, log_every=10, lr=3e-3, seed=seed)
    metrics, reporter = train_locally(cfg)
    return reporter.rows[0]["loss"] - metrics["val_loss"]


def split_resnet_drop(lr: float) -> Callable[[int], float]:
    """tests/test_model_parallel.py::test_resnet_splits_into_stages_and_trains: loss[0] - loss[4] (needs > 0)."""
    def run(seed: int) -> float:
        torch.manual_seed(seed)
        pipe = Pipeline(build_model("resnet18", DataMeta("image", 10, 3, 32)), ["cpu"], stages=2, micro_batches=2)
        losses = fit_one_batch(pipe, lr, seed=seed)
        return losses[0] - losses[-1]
    return run


# name -> (the number per seed, the bound the test asserts it exceeds)
CASES: dict[str, tuple[Callable[[int], float], float]] = {
    "test_loop mixed precision bf16: val_acc": (val_acc(**FAST, epochs=2, precision="bf16"), 0.8),
    "test_loop mixed precision fp16: val_acc": (val_acc(**FAST, epochs=2, precision="fp16"), 0.8),
    "test_loop gpt-char: loss drop in 40 steps": (gpt_char_drop, 0.6),
    "test_loop parquet digits (as digits), 3 epochs: val_acc": (val_acc(**FAST, epochs=3), 0.9),
    "test_ray_train 2 workers x 32, 3 epochs: val_acc": (val_acc(**{**FAST, "batch_size": 64}, epochs=3), 0.9),
    "test_pool sgd 0.05, 2 workers, 2 epochs: val_acc": (
        val_acc(**{**FAST, "batch_size": 64}, optimizer="sgd", lr=0.05, epochs=2), 0.5),
    "test_warm sgd 0.05, 2 workers, 12 epochs: val_acc": (
        val_acc(**{**FAST, "batch_size": 64}, optimizer="sgd", lr=0.05, epochs=12), 0.9),
    "test_model_parallel split ResNet-18, SGD lr 0.01: loss drop": (split_resnet_drop(0.01), 0.0),
    "(before) split ResNet-18, SGD lr 0.1: loss drop": (split_resnet_drop(0.1), 0.0),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    report = {}
    print(f"{'case':<58}{'threshold':>10}{'worst':>9}{'median':>9}  all seeds pass")
    for name, (measure, threshold) in CASES.items():
        values = [measure(seed) for seed in range(args.seeds)]
        ok = all(math.isfinite(v) and v > threshold for v in values)
        report[name] = {"threshold": threshold, "values": values, "all_pass": ok}
        print(f"{name:<58}{threshold:>10.2f}{min(values):>9.3f}{statistics.median(values):>9.3f}  {ok}")
    write_result({"seeds": args.seeds, "cases": report, **provenance()}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
