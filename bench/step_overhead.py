"""The shared loop bare vs. inside a Ray Train worker: same model, data, steps, device; one run, side by side.

Prints steady-state throughput of each (median over log windows after the first, which holds warm-up and
compilation) and their ratio; for GPT models also tokens/s and MFU (nanoGPT's 6N + 12LHQT FLOPs per token
against a peak you pass). Goal: bare/ray <= 1.01.

    .venv/bin/python bench/step_overhead.py --quick                      # CPU, CI-sized
    python3 bench/step_overhead.py --model gpt2-124m --device cuda --precision bf16 --seq-len 1024 \\
        --batch-size 16 --steps 60 --compile --peak-tflops 790 --out bench/results/step_overhead_h200.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from common import provenance, steady_rate, write_result

from trainables.config import TrainConfig


def flops_per_token(cfg: TrainConfig) -> float | None:
    """nanoGPT's estimate, for GPT models: 6N for the matmuls, 12*L*H*Q*T for attention."""
    from trainables.data.meta import DataMeta
    from trainables.data.synthetic import GPT2_VOCAB
    from trainables.models import MODELS

    if not cfg.model.startswith("gpt"):
        return None
    vocab = GPT2_VOCAB if (cfg.dataset or MODELS[cfg.model].default_dataset) == "fake-tokens" else 256
    model = MODELS[cfg.model].build(DataMeta(kind="tokens", num_classes=vocab, seq_len=cfg.seq_len))
    n_params = sum(p.numel() for p in model.parameters())
    c = model.cfg
    return 6 * n_params + 12 * c.n_layer * c.n_embd * cfg.seq_len


def run_bare(cfg: TrainConfig, device: str) -> tuple[float, list[dict]]:
    from trainables.local import train_locally

    started = time.perf_counter()
    _, reporter = train_locally(cfg, device=device)
    return time.perf_counter() - started, reporter.rows


def run_ray(cfg: TrainConfig, device: str) -> tuple[float, list[dict]]:
    import orchestrator

    with tempfile.TemporaryDirectory() as tmp:
        import os

        os.chdir(tmp)
        started = time.perf_counter()
        run = orchestrator.launch(workers=1, gpus_per_worker=1 if device == "cuda" else 0, quiet=True,
                                  name="bench", **cfg.model_dump(exclude_defaults=True))
        return time.perf_counter() - started, run.rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="digits-cnn")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--image-size", type=int, default=64, help="side of the synthetic images")
    parser.add_argument("--loader-workers", type=int, default=0)
    parser.add_argument("--peak-tflops", type=float, default=None, help="for MFU, e.g. 790 (H200 measured)")
    parser.add_argument("--quick", action="store_true", help="CPU, 40 steps of the digits CNN")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    out = args.out.resolve() if args.out else None
    steps = 40 if args.quick else args.steps
    cfg = TrainConfig(model=args.model, precision=args.precision, batch_size=args.batch_size, seq_len=args.seq_len,
                      max_steps=steps, epochs=1000, log_every=max(1, steps // 8), compile=args.compile,
                      channels_last=args.channels_last, fake_samples=max(2048, steps * args.batch_size + 64),
                      image_size=args.image_size, loader_workers=args.loader_workers)
    bare_s, bare_rows = run_bare(cfg, args.device)
    ray_s, ray_rows = run_ray(cfg, args.device)
    key = "tokens_per_s" if cfg.model.startswith("gpt") else "samples_per_s"
    bare, ray = steady_rate(bare_rows, key), steady_rate(ray_rows, key)
    result = {
        "model": cfg.model, "device": args.device, "precision": cfg.precision, "compile": cfg.compile,
        "batch_size": cfg.batch_size, "seq_len": cfg.seq_len if key == "tokens_per_s" else None, "steps": steps,
        "image_size": cfg.image_size if key == "samples_per_s" else None, "loader_workers": cfg.loader_workers,
        f"bare_{key}": round(bare, 1), f"ray_{key}": round(ray, 1), "bare_over_ray": round(bare / ray, 4),
        "bare_wall_s": round(bare_s, 2), "ray_wall_s": round(ray_s, 2),
        **provenance(),
    }
    fpt = flops_per_token(cfg)
    if fpt and args.peak_tflops:
        result["mfu_bare"] = round(bare * fpt / (args.peak_tflops * 1e12), 4)
        result["mfu_ray"] = round(ray * fpt / (args.peak_tflops * 1e12), 4)
    if args.device == "cuda":
        import torch

        result["gpu"] = torch.cuda.get_device_name(0)
    print(f"{'':>8} {key:>16} {'wall s':>8}")
    print(f"{'bare':>8} {bare:>16,.0f} {bare_s:>8.1f}")
    print(f"{'ray':>8} {ray:>16,.0f} {ray_s:>8.1f}")
    print(f"bare/ray = {result['bare_over_ray']:.4f}   (goal <= 1.01)")
    for k in ("mfu_bare", "mfu_ray"):
        if k in result:
            print(f"{k} = {result[k]:.3f}")
    write_result(result, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
