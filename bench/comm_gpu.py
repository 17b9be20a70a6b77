"""What timing the gradient all-reduce costs on a GPU (trainables/parallel/comm.py): steps/s of GPT-2 124M
under DDP with PyTorch's built-in all-reduce, with PyTorch's own Python all-reduce hook, with the timing hook
timing every step, and with it timing one step in 10 (the default: one per log interval), alternated.

One GPU and NCCL with a world of 1: DDP still buckets every gradient and calls the hook for each bucket, so
the hook's own cost shows undiluted (no wire time to hide it); the all-reduce's wire time itself needs a
multi-GPU kind.

    python3 bench/comm_gpu.py --out bench/results/comm_gpu_h200.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
from common import provenance, write_result
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from trainables.config import TrainConfig
from trainables.data.meta import DataMeta
from trainables.models import build_model
from trainables.parallel.comm import AllReduceTimer
from trainables.parallel.compression import Compression

STEPS, WARMUP, ROUNDS = 20, 5, 3


def gpt2() -> torch.nn.Module:
    cfg = TrainConfig(model="gpt2-124m", seq_len=1024)
    return build_model(cfg.model, DataMeta(kind="tokens", num_classes=50257, seq_len=1024), cfg).cuda()


def step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    with torch.autocast("cuda", torch.bfloat16):
        logits = model(x)
    torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), x.flatten()).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def steps_per_s(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, n: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        step(model, opt, x)
    torch.cuda.synchronize()
    return n / (time.perf_counter() - start)


def ddp(variant: str) -> DistributedDataParallel:
    model = DistributedDataParallel(gpt2())
    if variant == "pytorch_hook":
        model.register_comm_hook(None, allreduce_hook)
    elif variant.startswith("timed_1_in_"):
        timer = AllReduceTimer(True, Compression(TrainConfig()), every=int(variant.rsplit("_", 1)[1]))
        model.register_comm_hook(None, timer.hook)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
    torch.manual_seed(0)
    x = torch.randint(0, 50257, (args.batch, 1024), device="cuda")
    models = {v: ddp(v) for v in ("builtin", "pytorch_hook", "timed_1_in_1", "timed_1_in_10")}
    opts = {v: torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True) for v, m in models.items()}
    for v, m in models.items():
        steps_per_s(m, opts[v], x, WARMUP)
    rates: dict[str, list[float]] = {v: [] for v in models}
    for _ in range(ROUNDS):
        for v, m in models.items():
            rates[v].append(steps_per_s(m, opts[v], x, STEPS))
    base = statistics.median(rates["builtin"])
    result = {"what": f"GPT-2 124M bf16 autocast, batch {args.batch} x 1024, DDP over NCCL with a world of 1 on one"
                      f" GPU: steps/s per all-reduce variant, {ROUNDS} alternated rounds of {STEPS} steps",
              "steps_per_s": {v: [round(r, 3) for r in rs] for v, rs in rates.items()},
              "builtin_over_variant": {v: round(base / statistics.median(rs), 4) for v, rs in rates.items()},
              **provenance()}
    print(result)
    write_result(result, args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
