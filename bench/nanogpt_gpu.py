"""A ~1.3B GPT (GPT-3 XL's shape: 24 layers, width 2048, 1024 tokens, batch 8) on one GPU: nanoGPT's own
model.py in its own bare loop (bf16 autocast, torch.compile, its fused AdamW) side by side with
`orchestrator launch --model gpt-1.3b` (the same shape, bf16, --compile, AdamW), then both again in float8
(torchao's tensorwise float8 training of the linear layers; nanoGPT's converted as torchao's docs show, once
with its tied output head and once without it, as ours keeps it in bf16). Tokens/s, MFU and energy per 1k
tokens (NVML's total-energy counter); nanoGPT's model.py comes from github.com/karpathy/nanoGPT (pass its path).

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


NANOGPT_SIDES = {"nanogpt_bf16": None, "nanogpt_fp8": "all", "nanogpt_fp8_no_head": "no-head"}
OURS_SIDES = {"orchestrator_bf16": "bf16", "orchestrator_fp8": "fp8"}


def float8(model, linears: str) -> None:
    """torchao's float8 training on nanoGPT's linear layers (shapes that are multiples of 16), before compile."""
    from torch import nn
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    def eligible(module: nn.Module, name: str) -> bool:
        fits = isinstance(module, nn.Linear) and module.in_features % 16 == 0 and module.out_features % 16 == 0
        return fits and not (linears == "no-head" and name == "lm_head")

    convert_to_float8_training(model, module_filter_fn=eligible,
                               config=Float8LinearConfig.from_recipe_name("tensorwise"))


def nanogpt_bare(model_py: Path, linears: str | None) -> dict:
    """nanoGPT's model and optimizer in the loop of its bench.py: random tokens already on the GPU; LINEARS
    ("all", "no-head") converts those linear layers to float8, None keeps bf16."""
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
    if linears:
        float8(model, linears)
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


def bare(model_py: Path, side: str) -> dict:
    """nanoGPT in a process of its own, so each side starts from an empty GPU."""
    proc = subprocess.run([sys.executable, __file__, "--nanogpt", str(model_py), "--bare-only", side],
                          capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{side} failed: {(proc.stdout + proc.stderr)[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(side, json.dumps(result), flush=True)
    return result


def ratio(result: dict, top: str, bottom: str) -> float | None:
    if top in result and bottom in result:
        return round(result[top]["tokens_per_s"] / result[bottom]["tokens_per_s"], 3)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nanogpt", type=Path, required=True, help="nanoGPT's model.py")
    parser.add_argument("--bare-only", choices=NANOGPT_SIDES, help="(internal) run this nanoGPT side, print JSON")
    parser.add_argument("--sides", default=",".join([*NANOGPT_SIDES, *OURS_SIDES]), help="which runs, in order")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.bare_only:
        print(json.dumps(nanogpt_bare(args.nanogpt, NANOGPT_SIDES[args.bare_only])))
        return
    result = {"what": f"GPT {LAYERS} layers x {WIDTH} ({HEADS} heads, 1.3B parameters with biases), {SEQ} tokens,"
                      f" batch {BATCH}, AdamW, torch.compile, one GPU: nanoGPT's model.py in its bench loop"
                      f" ({TIMED} steps after {WARMUP}) vs `orchestrator launch --model gpt-1.3b` (summary: the"
                      " windows after the first), bf16 and float8 (tensorwise)"}
    with tempfile.TemporaryDirectory() as tmp:
        for side in args.sides.split(","):
            result[side] = bare(args.nanogpt, side) if side in NANOGPT_SIDES else ours(OURS_SIDES[side], Path(tmp))
            write_result({**result, **provenance()}, args.out)  # a call cut short keeps the sides it finished
    result |= {"orchestrator_over_nanogpt": ratio(result, "orchestrator_bf16", "nanogpt_bf16"),
               "fp8_over_bf16": ratio(result, "orchestrator_fp8", "orchestrator_bf16"),
               "nanogpt_fp8_over_bf16": ratio(result, "nanogpt_fp8", "nanogpt_bf16"),
               "nanogpt_fp8_no_head_over_bf16": ratio(result, "nanogpt_fp8_no_head", "nanogpt_bf16"),
               **provenance()}
    print(json.dumps(result, indent=1))
    write_result(result, args.out)


if __name__ == "__main__":
    main()
