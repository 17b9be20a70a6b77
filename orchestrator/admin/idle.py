"""The idle watcher of `orchestrator up`: ends it once no launch has run on it for the idle timeout.

    python -m orchestrator.admin.idle STATE_FILE IN_USE_FOLDER TIMEOUT_S TEMP_DIR

Launches mark themselves with a file named by their pid in IN_USE_FOLDER (groundwork.localray.in_use);
the folder's modification time is when the last one started or ended. TEMP_DIR is only named so that `down`
finds this process with the cluster's own.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from orchestrator.admin.nodes import down

POLL_S = 2.0


def idle_seconds(in_use: Path) -> float | None:
    """Seconds since the last launch on it started or ended; None while one runs. A marker whose launch is gone
    (killed before it could remove it) is removed, which counts as that launch ending now."""
    running = False
    for marker in in_use.iterdir():
        if Path("/proc", marker.name).exists():
            running = True
        else:
            marker.unlink(missing_ok=True)
    return None if running else time.time() - in_use.stat().st_mtime


def watch(state_file: Path, in_use: Path, timeout_s: float) -> None:
    while state_file.exists():  # `down` removes it
        idle = idle_seconds(in_use)
        if idle is not None and idle >= timeout_s:
            down(state_file)
            return
        time.sleep(min(POLL_S, timeout_s / 4))


if __name__ == "__main__":
    watch(Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]))
