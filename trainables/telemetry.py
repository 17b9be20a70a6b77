"""A rank's telemetry between log points: CPU use (all its threads, from the process CPU clock) and resident
memory (from /proc; the peak where /proc is missing), and on CUDA its GPU through NVML. The loop reads them
at each log point, where the ranks already exchange their figures (trainables.health)."""

from __future__ import annotations

import logging
import os
import resource
import sys
import time
from pathlib import Path

import torch

PAGE_MIB = os.sysconf("SC_PAGE_SIZE") / 2**20 if hasattr(os, "sysconf") else 4 / 1024


def rss_mib() -> float:
    """Resident memory now (Linux), else the peak so far."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * PAGE_MIB
    except (OSError, IndexError, ValueError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
        return peak / 2**20 if sys.platform == "darwin" else peak / 1024


class HostTelemetry:
    """CPU % (100 = one core busy) since the last sample, and RSS in MiB."""

    def __init__(self) -> None:
        self.last = (time.monotonic(), time.process_time())

    def sample(self) -> tuple[float, float]:
        now = (time.monotonic(), time.process_time())
        wall, cpu = now[0] - self.last[0], now[1] - self.last[1]
        self.last = now
        return 100.0 * cpu / wall if wall > 0 else 0.0, rss_mib()


class GpuTelemetry:
    """This rank's GPU through NVML (nvidia-ml-py), read at each log point: utilisation (NVML's own average
    over its last sample period), memory used, power, and the energy since the last read (NVML's
    total-energy counter, mJ); plus PyTorch's peak allocated memory. No CUDA call, so no host sync."""

    def __init__(self, device: torch.device) -> None:
        import pynvml  # deferred: CUDA ranks only

        pynvml.nvmlInit()
        self.nvml = pynvml
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        self.handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        self.device = device
        self.energy_mj = self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)

    def sample(self) -> dict[str, float]:
        energy = self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
        joules, self.energy_mj = (energy - self.energy_mj) / 1000, energy
        return {"gpu_util_pct": float(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu),
                "gpu_mem_mib": self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used / 2**20,
                "gpu_power_w": self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1000,
                "gpu_energy_j": joules,
                "gpu_max_alloc_mib": torch.cuda.max_memory_allocated(self.device) / 2**20}


def gpu_telemetry(device: torch.device) -> GpuTelemetry | None:
    """NVML for a CUDA rank, else None (CPU, or no NVIDIA library: the GPU columns are left out)."""
    if device.type != "cuda":
        return None
    try:
        return GpuTelemetry(device)
    except Exception as exc:  # nvidia-ml-py or the driver's NVML missing: training goes on without
        logging.getLogger(__name__).warning("no GPU telemetry (%s: %s)", type(exc).__name__, exc)
        return None
