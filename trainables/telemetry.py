"""This process's host telemetry between log points: CPU use (all its threads, from the process CPU clock)
and resident memory (from /proc; the peak where /proc is missing). Standard library only: the loop reads it
at each log point, where the ranks already exchange their figures (trainables.health)."""

from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path

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
