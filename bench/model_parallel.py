"""Model parallel inside one worker vs. plain DDP, through `orchestrator.launch`, in one run.

Runs the same GPT job with k=1 (strategy ddp) and with k stages and m micro-batches (strategy
model-parallel), each in one Ray Train worker owning the GPUs it is given, and prints steady-state tokens/s
and the ratio. On a one-GPU machine all k stages share cuda:0: that proves the device mapping and the
schedule on CUDA, and measures what the extra micro-batching costs; real speed-ups need k GPUs per worker.

    python3 bench/model_parallel.py --stages 2 --micro-batches 4 --out bench/results/model_parallel_h200.json
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from common import provenance, steady_rate, write_result

import orchestrator


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt2-124m")
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--gpus-per-worker", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--quick", action="store_true", help="CPU: gpt-char, 16 steps")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    out = args.out.resolve() if args.out else None
    gpus = 0 if args.quick else args.gpus_per_worker
    job = {"model": "gpt-char" if args.quick else args.model, "batch_size": args.batch_size,
           "seq_len": 64 if args.quick else args.seq_len, "max_steps": 16 if args.quick else args.steps,
           "precision": "fp32" if args.quick else args.precision, "epochs": 1000, "workers": 1,
           "gpus_per_worker": gpus, "quiet": True}
    job["log_every"] = max(1, job["max_steps"] // 6)
    job["fake_samples"] = job["max_steps"] * args.batch_size + 64
    rates = {}
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        rates[1] = steady_rate(orchestrator.launch(name="k1", **job).rows, "tokens_per_s")
        mp = {"strategy": "model-parallel", "stages": args.stages, "micro_batches": args.micro_batches}
        rates[args.stages] = steady_rate(orchestrator.launch(name="kN", **job, **mp).rows, "tokens_per_s")
    result = {"job": job, "stages": args.stages, "micro_batches": args.micro_batches,
              "tokens_per_s_k1": round(rates[1]), f"tokens_per_s_k{args.stages}": round(rates[args.stages]),
              "k_over_k1": round(rates[args.stages] / rates[1], 4), **provenance()}
    if gpus:
        import torch

        result["gpu"] = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    print(f"k=1: {rates[1]:,.0f} tok/s   k={args.stages} (m={args.micro_batches}): {rates[args.stages]:,.0f} tok/s"
          f"   ratio {result['k_over_k1']:.3f}")
    write_result(result, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
