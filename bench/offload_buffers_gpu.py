"""FSDP's CPU offload with a model that has buffers (BatchNorm's statistics), on one GPU: FSDP keeps the
parameter shards on the CPU and the buffers on the GPU, and loading a full state dict (meta init's broadcast,
a resume from a full checkpoint) wants one device. Checks, in one run:
1. torch alone, a world of one over NCCL: Linear-BatchNorm-Linear under fully_shard(CPUOffloadPolicy), a full
   state dict loaded with and without trainables.parallel.fsdp.buffers_beside_shards;
2. `orchestrator launch --model resnet18 --strategy fsdp --cpu-offload`, stopped after one epoch and resumed.

    python3 bench/offload_buffers_gpu.py --out bench/results/offload_buffers_gpu_h100.json
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from common import provenance, write_result
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

from trainables.parallel.fsdp import buffers_beside_shards

RESNET = ["--model", "resnet18", "--fake-samples", "512", "--image-size", "64", "--batch-size", "64", "--strategy",
          "fsdp", "--cpu-offload", "--precision", "bf16", "--workers", "1", "--gpus-per-worker", "1", "--quiet",
          "--epochs", "2"]


def small_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 4))


def load_into_offloaded(guarded: bool) -> str:
    """Load a full state dict (BatchNorm's running mean moved by 3) into an offloaded FSDP model: what it gave."""
    full = small_model().state_dict()
    full["1.running_mean"] += 3.0
    model = small_model()
    fully_shard(model, offload_policy=CPUOffloadPolicy())
    try:
        with buffers_beside_shards(model) if guarded else contextlib.nullcontext():
            set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True))
        model(torch.randn(4, 8, device="cuda"))
    except Exception as exc:  # what a plain load raises is the finding
        return f"failed: {type(exc).__name__}: {str(exc)[:160]}"
    mean = model[1].running_mean
    return f"loaded: running_mean {mean.mean().item():.3f} on {mean.device}, forward ran"


def launch(folder: Path, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "launch", *args], cwd=folder, capture_output=True,
                          text=True)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    return f"rc {proc.returncode}: {lines[-1] if lines else ''}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    loads = {"plain": load_into_offloaded(False), "buffers_beside_shards": load_into_offloaded(True)}
    dist.destroy_process_group()
    with tempfile.TemporaryDirectory() as tmp:
        first = launch(Path(tmp), *RESNET, "--stop-after-epochs", "1", "--name", "offload")
        resumed = launch(Path(tmp), "--resume", "offload", "--stop-after-epochs", "2", "--quiet")
    result = {"what": __doc__.split("\n\n")[0], "loads": loads, "resnet18_first_epoch": first,
              "resnet18_resumed": resumed, **provenance()}
    print(result)
    write_result(result, args.out)


if __name__ == "__main__":
    main()
