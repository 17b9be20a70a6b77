"""Input pipeline: Parquet (pyarrow) of JPEG bytes -> decoded -> pinned -> on the GPU, against what the model
eats. One run, side by side: the loader alone (batches to the device, no model), the model on synthetic data
(no decoding), and the model on the Parquet data. loader/model >= 1 means the loader is never the bottleneck.

    .venv/bin/python bench/input_pipeline.py --quick                                     # CPU, CI-sized
    python3 bench/input_pipeline.py --device cuda --model resnet50 --image-size 224 --batch-size 256 \\
        --loader-workers 12 --precision bf16 --channels-last --out bench/results/input_pipeline_h200_resnet50.json
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path

from common import provenance, steady_rate, write_result

from trainables.config import TrainConfig


def jpeg(args: tuple[int, int]) -> bytes:
    """A photo-like JPEG: a smooth random field plus grain (pure noise would be an unfair, huge file)."""
    import numpy as np
    from PIL import Image

    seed, size = args
    rng = np.random.default_rng(seed)
    coarse = Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).resize((size, size), Image.BICUBIC)
    pixels = np.asarray(coarse, dtype=np.int16) + rng.integers(-12, 13, (size, size, 3))
    out = io.BytesIO()
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(out, format="JPEG", quality=90)
    return out.getvalue()


def write_parquet(folder: Path, n: int, size: int, classes: int) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    with Pool() as pool:
        images = pool.map(jpeg, [(i, size) for i in range(n)], chunksize=64)
    for split, rows in (("train", images), ("val", images[: max(1, n // 10)])):
        labels = [i % classes for i in range(len(rows))]
        pq.write_table(pa.table({"image": pa.array(rows, pa.binary()), "label": labels}), folder / f"{split}.parquet")
    return folder


def loader_rate(cfg: TrainConfig, device: str, batches: int) -> float:
    """Images/s of the train loader alone, each batch copied to the device and scaled as the loop does."""
    import torch

    from trainables.context import DistContext
    from trainables.objective import to_device
    from trainables.run import build_loaders

    ctx = DistContext(devices=(torch.device(device),))
    loaders, _ = build_loaders(cfg, ctx)
    loaders.sampler.set_epoch(0)
    seen, started = 0, None
    for i, (x, y) in enumerate(loaders.train):
        x, _ = to_device(x, y, ctx, cfg)
        if i == 2:  # after the loader processes have started and warmed up
            if device == "cuda":
                torch.cuda.synchronize()
            started, seen = time.perf_counter(), 0
        seen += len(x)
        if i + 1 >= batches:
            break
    if device == "cuda":
        torch.cuda.synchronize()
    return seen / (time.perf_counter() - started)


def model_rate(cfg: TrainConfig, device: str) -> float:
    from trainables.local import train_locally

    _, reporter = train_locally(cfg, device=device)
    return steady_rate(reporter.rows, "samples_per_s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--loader-workers", type=int, default=8)
    parser.add_argument("--images", type=int, default=8192, help="how many JPEGs to write")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--quick", action="store_true", help="CPU: resnet18 on 32 px, 2 loader workers")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    out = args.out.resolve() if args.out else None
    if args.quick:
        args.model, args.image_size, args.batch_size, args.loader_workers = "resnet18", 32, 32, 2
        args.images, args.steps = 512, 12
    with tempfile.TemporaryDirectory() as tmp:
        data = write_parquet(Path(tmp), args.images, args.image_size, classes=1000)
        common = {"model": args.model, "batch_size": args.batch_size, "precision": args.precision,
                  "loader_workers": args.loader_workers, "channels_last": args.channels_last,
                  "max_steps": args.steps, "epochs": 1000, "log_every": max(1, args.steps // 8)}
        parquet = TrainConfig(**common, dataset="parquet", data_path=str(data))
        loader = loader_rate(parquet, args.device, batches=min(args.steps, args.images // args.batch_size))
        synthetic = model_rate(TrainConfig(**common, dataset="fake-images", image_size=args.image_size,
                                           fake_samples=args.images), args.device)
        on_parquet = model_rate(parquet, args.device)
    result = {
        "model": args.model, "device": args.device, "precision": args.precision, "image_size": args.image_size,
        "batch_size": args.batch_size, "loader_workers": args.loader_workers, "images": args.images,
        "loader_images_per_s": round(loader, 1), "model_images_per_s_synthetic": round(synthetic, 1),
        "model_images_per_s_parquet": round(on_parquet, 1), "loader_over_model": round(loader / synthetic, 3),
        "parquet_over_synthetic": round(on_parquet / synthetic, 3),
        **provenance(),
    }
    print(f"loader alone          {loader:>10,.0f} img/s")
    print(f"model, synthetic data {synthetic:>10,.0f} img/s")
    print(f"model, parquet data   {on_parquet:>10,.0f} img/s")
    print(f"loader/model = {result['loader_over_model']:.2f} (>= 1: never the bottleneck); "
          f"parquet/synthetic = {result['parquet_over_synthetic']:.2f}")
    write_result(result, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
