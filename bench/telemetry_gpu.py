"""GPU telemetry and MFU through `orchestrator launch`, checked against nvidia-smi sampled during the same
runs: GPT-2 124M (bf16, torch.compile) and ResNet-50 (bf16, channels_last) on one GPU. The rows' NVML figures
(utilisation, memory, power), energy per token/image and MFU are printed beside nvidia-smi's averages over the
steady part of each run (samples with the GPU busy).

    python3 bench/telemetry_gpu.py --out bench/results/telemetry_gpu_h200.json
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = {"what": "NVML telemetry and MFU in the rows of `orchestrator launch` vs nvidia-smi during the"
                          " same runs (MFU of NVIDIA's dense bf16 peak, 989 TFLOP/s for an H200)",
                  **{name: run(name, Path(tmp)) for name in RUNS}, **provenance()}
    print(result)
    write_result(result, args.out)


if __name__ == "__main__":
    main()
