"""A ~1.3B GPT (GPT-3 XL's shape: 24 layers, width 2048, 1024 tokens, batch 8) on one GPU: nanoGPT's own
model.py in its own bare loop (bf16 autocast, torch.compile, its fused AdamW) side by side with
`orchestrator launch --model gpt-1.3b` (the same shape, bf16, --compile, AdamW), then the launch again with
--precision fp8 (torchao float8). Tokens/s, MFU and energy per 1k tokens (NVML's total-energy counter);
nanoGPT's model.py comes from github.com/karpathy/nanoGPT (pass its path).

    python3 bench/nanogpt_gpu.py --nanogpt .ext/nanogpt/model.py --out bench/results/nanogpt_gpu_h200.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ONE_GPU, launch_summary, provenance, write_result

LAYERS, HEADS, WIDTH, SEQ, BATCH, VOCAB = 24, 16, 2048, 1024, 8, 50304
WARMUP, TIMED = 10, 50
OURS = ["--model", "gpt-1.3b", "--dataset", "fake-tokens", "--seq-len", str(SEQ), "--batch-size", str(BATCH),
        "--compile", "--optimizer", "adamw", "--lr", "6e-4", "--fake-samples", "1024", "--val-fraction", "0.1",
        "--max-steps", str(WARMUP + TIMED + 10), "--log-every", "10", "--no-checkpoints", *ONE_GPU]


def nanogpt_bare(model_py: Path) -> dict:
    """nanoGPT's model and optimizer in the loop of its bench.py: random tokens already on the GPU."""
    import importlib.util

    import pynvml
    import torch

    spec = importlib.util.spec_from_file_location("nanogpt_model", model_py)
    nano = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nano)
    torch.manual_seed(0)
    model = nano.GPT(nano.GPTConfig(block_size=SEQ, vocab_size=VOCAB, n_layer=LAYERS, n_head=HEADS, n_embd=WIDTH,
                                    dropout=0.0, bias=True)).cuda()
    optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), "cuda")
    model = torch.compile(model)
    x = torch.randint(VOCAB, (BATCH, SEQ), device="cuda")
    y = torch.randint(VOCAB, (BATCH, SEQ), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(WARMUP):
        step()
    torch.cuda.synchronize()
    pynvml.nvmlInit()
    gpu = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    energy_mj, started = pynvml.nvmlDeviceGetTotalEnergyConsumption(gpu), time.perf_counter()
    for _ in range(TIMED):
        step()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    joules = (pynvml.nvmlDeviceGetTotalEnergyConsumption(gpu) - energy_mj) / 1000
    tokens = TIMED * BATCH * SEQ
    return {"tokens_per_s": tokens / seconds, "energy_j_per_1k_tokens": joules / tokens * 1000,
            "peak_gpu_max_alloc_mib": torch.cuda.max_memory_allocated() / 2**20}


def ours(precision: str, folder: Path) -> dict:
    summary, tail = launch_summary([*OURS, "--precision", precision], f"gpt-1.3b-{precision}", folder)
    if summary is None:
        raise SystemExit(f"gpt-1.3b {precision} failed: {tail}")
    summary["energy_j_per_1k_tokens"] = summary.pop("energy_j_per_token", float("nan")) * 1000
    print(precision, json.dumps(summary), flush=True)  # a call cut short still shows the runs it finished
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nanogpt", type=Path, required=True, help="nanoGPT's model.py")
    parser.add_argument("--bare-only", action="store_true", help="(internal) run nanoGPT here, print its JSON")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.bare_only:
        print(json.dumps(nanogpt_bare(args.nanogpt)))
        return
    # nanoGPT in a process of its own, so each side starts from an empty GPU
    bare = subprocess.run([sys.executable, __file__, "--nanogpt", str(args.nanogpt), "--bare-only"],
                          capture_output=True, text=True, check=True)
    nanogpt = json.loads(bare.stdout.strip().splitlines()[-1])
    print("nanogpt", json.dumps(nanogpt), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        bf16 = ours("bf16", Path(tmp))
        fp8 = ours("fp8", Path(tmp))
    result = {"what": f"GPT {LAYERS} layers x {WIDTH} ({HEADS} heads, 1.3B parameters with biases), {SEQ} tokens,"
                      f" batch {BATCH}, AdamW, torch.compile, one GPU: nanoGPT's model.py in its bench loop"
                      f" ({TIMED} steps after {WARMUP}) vs `orchestrator launch --model gpt-1.3b` (summary: the"
                      " windows after the first), bf16 and fp8",
              "nanogpt_bf16": nanogpt, "orchestrator_bf16": bf16, "orchestrator_fp8": fp8,
              "orchestrator_over_nanogpt": round(bf16["tokens_per_s"] / nanogpt["tokens_per_s"], 3),
              "fp8_over_bf16": round(fp8["tokens_per_s"] / bf16["tokens_per_s"], 3), **provenance()}
    print(json.dumps(result, indent=1))
    write_result(result, args.out)


if __name__ == "__main__":
    main()
