"""Test helpers importable by Ray workers (functions in test modules' __main__ would not pickle)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from trainables.checkpoint import load_state


def final_weights(folder: str | Path) -> dict[str, torch.Tensor]:
    return load_state(folder)["model"]


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def user_entry(config: dict) -> None:
    """A user's own train function for --entry: records what each worker was given."""
    import ray.train

    ctx = ray.train.get_context()
    out = Path(config["run_dir"]) / f"entry-rank{ctx.get_world_rank()}.json"
    out.write_text(json.dumps({"rank": ctx.get_world_rank(), "world": ctx.get_world_size(),
                               "lr": config["lr"], "omp": os.environ.get("OMP_NUM_THREADS")}))
