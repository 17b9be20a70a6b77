"""GPU telemetry and MFU through `orchestrator launch`, checked against nvidia-smi sampled during the same
runs: GPT-2 124M (bf16, torch.compile) and ResNet-50 (bf16, channels_last) on one GPU. The rows' NVML figures
(utilisation, memory, power), energy per token/image and MFU are printed beside nvidia-smi's averages over the
steady part of each run (samples with the GPU busy).

    python3 bench/telemetry_gpu.py --out bench/results/telemetry_gpu_h200.json
    python3 bench/telemetry_gpu.py --overhead 2 --out bench/results/telemetry_overhead_h200.json
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
from common import provenance, write_result

CLI = [sys.executable, "-m", "orchestrator", "launch", "--workers", "1", "--gpus-per-worker", "1", "--quiet",
       "--precision", "bf16", "--log-every", "10"]
RUNS = {
    "gpt2": ["--model", "gpt2-124m", "--dataset", "fake-tokens", "--seq-len", "1024", "--batch-size", "32",
             "--compile", "--fake-samples", "8192", "--max-steps", "160"],
    "resnet50": ["--model", "resnet50", "--dataset", "fake-images", "--image-size", "224", "--batch-size", "256",
                 "--channels-last", "--loader-workers", "8", "--fake-samples", "25600", "--max-steps", "90"],
}
SMI = ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used,power.draw", "--format=csv,noheader,nounits",
       "-lms", "500"]


def run(name: str, folder: Path) -> dict:
    with open(folder / f"{name}.smi", "w") as smi_out:
        smi = subprocess.Popen(SMI, stdout=smi_out)
        proc = subprocess.run([*CLI, *RUNS[name], "--name", name], cwd=folder, capture_output=True, text=True)
        smi.terminate()
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed: {proc.stderr[-2000:]}")
    rows = pd.read_parquet(folder / "runs" / name / "metrics.parquet").dropna(subset=["gpu_util_pct_mean"])
    steady = rows.iloc[1:]  # the first window holds compilation and warm-up
    samples = [[float(v) for v in line.split(",")] for line in (folder / f"{name}.smi").read_text().splitlines()
               if line.strip()]
    busy = [s for s in samples if s[0] >= 50]  # nvidia-smi's samples while the GPU trained
    rate = "tokens_per_s" if "tokens_per_s" in steady else "samples_per_s"
    energy = "energy_j_per_token" if "energy_j_per_token" in steady else "energy_j_per_sample"
    ours = {"util_pct": steady["gpu_util_pct_mean"].mean(), "mem_mib": steady["gpu_mem_mib_max"].max(),
            "power_w": steady["gpu_power_w_mean"].mean()}
    smi_avg = {"util_pct": statistics.fmean(s[0] for s in busy), "mem_mib": max(s[1] for s in busy),
               "power_w": statistics.fmean(s[2] for s in busy)}
    return {"rows": len(rows), rate: round(steady[rate].median(), 1), "mfu": round(steady["mfu"].median(), 4),
            "model_tflops": round(steady["model_tflops"].median(), 1), energy: steady[energy].median(),
            "max_alloc_mib": round(steady["gpu_max_alloc_mib_max"].max()), "rows_nvml": ours, "nvidia_smi": smi_avg,
            "nvml_over_smi": {k: round(ours[k] / smi_avg[k], 3) for k in ours}, "smi_busy_samples": len(busy)}


def overhead(folder: Path, pairs: int) -> dict:
    """GPT-2's steady tokens/s with telemetry on and off, alternated, each the median of its run's windows."""
    rates: dict[str, list[float]] = {"on": [], "off": []}
    for i in range(pairs):
        for mode in ("on", "off"):
            name = f"gpt2-{mode}-{i}"
            proc = subprocess.run([*CLI, *RUNS["gpt2"], "--name", name, f"--{'' if mode == 'on' else 'no-'}telemetry"],
                                  cwd=folder, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"{name} failed: {proc.stderr[-2000:]}")
            rows = pd.read_parquet(folder / "runs" / name / "metrics.parquet").dropna(subset=["tokens_per_s"])
            rates[mode].append(float(rows["tokens_per_s"].iloc[1:].median()))
    return {"tokens_per_s": rates, "off_over_on": round(statistics.median(rates["off"]) /
                                                        statistics.median(rates["on"]), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--overhead", type=int, default=0, metavar="PAIRS",
                        help="only GPT-2 with telemetry on and off, alternated PAIRS times")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.overhead:
            result = {"what": "GPT-2 124M bf16 compiled, 1 GPU: tokens/s with --telemetry vs --no-telemetry,"
                              " alternated", **overhead(Path(tmp), args.overhead), **provenance()}
        else:
            result = {"what": "NVML telemetry and MFU in the rows of `orchestrator launch` vs nvidia-smi during"
                              " the same runs (MFU of NVIDIA's dense bf16 peak, 989 TFLOP/s for an H200)",
                      **{name: run(name, Path(tmp)) for name in RUNS}, **provenance()}
    print(result)
    write_result(result, args.out)


if __name__ == "__main__":
    main()
