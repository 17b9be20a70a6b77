"""What every bench script shares: reading steady-state rates from a run's rows, writing results."""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
from datetime import datetime
from pathlib import Path


def steady_rate(rows: list[dict], key: str) -> float:
    """Median rate over the log windows after the first (which holds warm-up and compilation)."""
    rates = [r[key] for r in rows if key in r and r.get("val_loss") is None]
    return statistics.median(rates[1:] if len(rates) > 1 else rates)


def log_stamp(line: str) -> float:
    """Epoch seconds of a rank log line: "[rank 0] 2026-12-03 01:41:12,239 INFO ..."."""
    return datetime.strptime(" ".join(line.split()[2:4]), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def write_result(result: dict, out: Path | None) -> None:
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")


def gpu_names() -> str:
    """The GPUs nvidia-smi lists ("" where it is missing): which card a figure was measured on."""
    try:
        found = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                               text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return ", ".join(found.stdout.split("\n")[:-1]) if found.returncode == 0 else ""


def provenance() -> dict[str, str]:
    """Where and how a result was made: the machine, its GPUs and the exact command, kept in every result file."""
    return {"machine": f"{platform.machine()}, Python {platform.python_version()}", "gpus": gpu_names(),
            "command": " ".join(["python3", *sys.argv])}


ONE_GPU = ["--workers", "1", "--gpus-per-worker", "1", "--quiet"]
SUMMARY_KEYS = ("tokens_per_s", "mfu", "peak_gpu_max_alloc_mib", "peak_gpu_mem_mib", "gpu_power_w",
                "energy_j_per_token")


def launch_summary(args: list[str], name: str, folder: Path) -> tuple[dict | None, str]:
    """`orchestrator launch ARGS --name NAME` in FOLDER: (the run's summary.json figures, or None where the
    launch failed; the last lines of its output, which say why)."""
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "launch", *args, "--name", name], cwd=folder,
                          capture_output=True, text=True)
    tail = (proc.stdout + proc.stderr)[-3000:]
    if proc.returncode:
        return None, tail
    summary = json.loads((folder / "runs" / name / "summary.json").read_text())
    return {k: summary[k] for k in SUMMARY_KEYS if k in summary}, tail
