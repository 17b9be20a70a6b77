"""What gradient compression costs per step on one GPU, where nothing crosses a wire: GPT-2 124M (bf16,
torch.compile, batch 16 x 1024) with --grad-compression none (a world of one runs no DDP: the bare model), bf16
and powersgd (rank 4, its error feedback and two small matmuls per matrix; a DDP of one runs the hook), side by
side in one call. Tokens/s, and the rows' timed all-reduce (ms and MiB per step; the hook times one step per log
interval). Across GPUs the same MiB figures are what the wire carries; the saving in time needs a multi-GPU
machine to measure.

    python3 bench/compression_gpu.py --out bench/results/compression_gpu_h200.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import pandas as pd
from common import ONE_GPU, launch_summary, provenance, write_result

RUN = ["--model", "gpt2-124m", "--dataset", "fake-tokens", "--seq-len", "1024", "--batch-size", "16", "--compile",
       "--precision", "bf16", "--fake-samples", "4096", "--val-fraction", "0.05", "--max-steps", "120",
       "--log-every", "10", "--no-checkpoints", *ONE_GPU]
POWERSGD = ["--powersgd-rank", "4", "--powersgd-warmup", "10"]
COMPRESSIONS = ("none", "bf16", "powersgd")


def run(compression: str, folder: Path) -> dict:
    settings = [*RUN, "--grad-compression", compression, *(POWERSGD if compression == "powersgd" else [])]
    summary, tail = launch_summary(settings, compression, folder)
    if summary is None:
        raise SystemExit(f"{compression} failed: {tail}")
    rows = pd.read_parquet(folder / "runs" / compression / "metrics.parquet").iloc[2:]  # after warm-up windows
    for column in ("allreduce_ms_per_step_mean", "allreduce_mib_per_step_mean", "allreduce_share_mean"):
        if column in rows:
            summary[column.removesuffix("_mean")] = float(rows[column].median())
    print(compression, json.dumps(summary), flush=True)  # a call cut short still shows the runs it finished
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = {c: run(c, Path(tmp)) for c in COMPRESSIONS}
    base = runs["none"]["tokens_per_s"]
    result = {"what": "GPT-2 124M, DDP on one GPU, bf16, torch.compile, batch 16 x 1024, 120 steps:"
                      " --grad-compression none / bf16 / powersgd (rank 4)", "runs": runs,
              "tokens_per_s_over_none": {c: round(r["tokens_per_s"] / base, 3) for c, r in runs.items()},
              **provenance()}
    print(json.dumps(result, indent=1))
    write_result(result, args.out)


if __name__ == "__main__":
    main()
