"""What this machine has, for `auto` values in a spec (the default local spec is all `auto`)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class LocalHardware:
    cpus: int
    gpus: int
    gpu_type: str | None
    gpu_memory_gb: float | None
    memory_gb: float | None
    loopback: str


def _cpus() -> int:
    # Respect cgroup/affinity limits (containers, taskset), which os.cpu_count ignores.
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _nvidia_smi() -> list[tuple[str, float]]:
    """(name, memory GiB) per GPU, from nvidia-smi; empty when it is absent or fails."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError):
        return []
    rows = [line.rsplit(",", 1) for line in out.strip().splitlines() if "," in line]
    return [(name.strip(), float(mib) / 1024) for name, mib in rows]


def _memory_gb() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return None


def _loopback() -> str:
    names = [name for _, name in socket.if_nameindex()]
    return next((n for n in names if n in ("lo", "lo0")), "lo")


def detect() -> LocalHardware:
    gpus = _nvidia_smi()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        gpus = gpus[: len([v for v in visible.split(",") if v.strip()])]
    return LocalHardware(
        cpus=_cpus(),
        gpus=len(gpus),
        gpu_type=gpus[0][0] if gpus else None,
        gpu_memory_gb=round(gpus[0][1], 1) if gpus else None,
        memory_gb=round(m, 1) if (m := _memory_gb()) else None,
        loopback=_loopback(),
    )
