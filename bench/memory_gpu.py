"""The largest model that trains on one GPU under each strategy, through `orchestrator launch`: ddp; fsdp without,
with per-op and with full activation checkpointing; fsdp with full activation checkpointing and CPU offload.
Llama shapes (llama-1b, -3b, -8b), AdamW (fp32 weights, gradients and two moments: 16 bytes per parameter
before activations), bf16, batch B x 1024, a few steps each. Each strategy climbs its ladder of sizes until
one runs out of memory; every run's peak memory (torch's max allocated, NVML's used) and tokens/s come from
its summary.json.

On one GPU FSDP shards nothing (one rank holds every shard): what it brings here is the per-block
gathering that activation checkpointing and offload build on. Its sharding divides the 16 bytes by the
number of GPUs, which this one-GPU bench cannot show.

    python3 bench/memory_gpu.py --out bench/results/memory_gpu_h200.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from common import ONE_GPU, launch_summary, provenance, write_result

LADDER = ["llama-1b", "llama-3b", "llama-8b"]
STRATEGIES = {
    "ddp": ["--strategy", "ddp"],
    "fsdp": ["--strategy", "fsdp"],
    "fsdp+op-ac": ["--strategy", "fsdp", "--activation-checkpointing", "op"],  # per-op: matmuls' outputs kept
    "fsdp+ac": ["--strategy", "fsdp", "--activation-checkpointing", "full"],
    "fsdp+ac+offload": ["--strategy", "fsdp", "--activation-checkpointing", "full", "--cpu-offload"],
}


def run_args(batch: int, steps: int) -> list[str]:
    return ["--dataset", "fake-tokens", "--seq-len", "1024", "--batch-size", str(batch), "--precision", "bf16",
            "--optimizer", "adamw", "--fake-samples", str(batch * (steps + 4)), "--val-fraction", "0.1",
            "--max-steps", str(steps), "--log-every", "2", "--no-checkpoints", *ONE_GPU]


def out_of_memory(tail: str) -> bool:
    return "out of memory" in tail.lower() or "OutOfMemoryError" in tail


def climb(strategy: str, sizes: list[str], common_args: list[str], folder: Path) -> dict:
    """Run `sizes` in order under `strategy` until one fails; what each did."""
    found: dict = {}
    for size in sizes:
        name = f"{strategy.replace('+', '-')}-{size}"
        summary, tail = launch_summary([*common_args, *STRATEGIES[strategy], "--model", size], name, folder)
        found[size] = summary or {"failed": "out of memory" if out_of_memory(tail) else tail[-600:]}
        print(strategy, size, json.dumps(found[size]), flush=True)
        if summary is None:
            break
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES))
    parser.add_argument("--sizes", nargs="+", default=LADDER, help="the ladder, smallest first")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = {s: climb(s, args.sizes, run_args(args.batch_size, args.steps), Path(tmp)) for s in args.strategies}
    largest = {s: max((size for size, r in found.items() if "failed" not in r), key=LADDER.index, default=None)
               for s, found in runs.items()}
    result = {"what": f"the largest Llama shape that trains on one GPU per strategy: AdamW, bf16, batch"
                      f" {args.batch_size} x 1024, {args.steps} steps, eager, through `orchestrator launch`",
              "largest": largest, "runs": runs, **provenance()}
    print(json.dumps(result, indent=1))
    write_result(result, args.out)


if __name__ == "__main__":
    main()
