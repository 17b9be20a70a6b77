"""Which run and rank each worker process serves, for `orchestrator top`: a worker writes
`<tmp>/orchestrator-ranks/<node id>/<pid>` ("run/rank") while it runs a job and removes it after (by node id:
the nodes of a loopback cluster share one /tmp); top reads the files of its node, drops those whose process
is gone, and names the holder of a GPU process by walking up its parents (a script's child, a DataLoader
worker: their rank is the worker that started them)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

HOLDERS_DIR = Path(tempfile.gettempdir()) / "orchestrator-ranks"
MAX_PARENTS = 6  # a GPU process this far below a worker: a script's child's own children


@contextlib.contextmanager
def holding(run: str, rank: int, node: str) -> Iterator[None]:
    """Mark this process, on Ray node `node`, as serving `run`'s `rank` while the block runs."""
    path = HOLDERS_DIR / node / str(os.getpid())
    with contextlib.suppress(OSError):  # top's names are a courtesy: never fail a job over them
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{run}/{rank}")
    try:
        yield
    finally:
        path.unlink(missing_ok=True)


def holders(node: str) -> dict[int, str]:
    """pid -> "run/rank" for the live workers of Ray node `node`; files of dead processes are removed."""
    out: dict[int, str] = {}
    for path in (HOLDERS_DIR / node).glob("[0-9]*"):
        pid = int(path.name)
        if Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                out[pid] = path.read_text()
        else:
            path.unlink(missing_ok=True)
    return out


def parent(pid: int) -> int | None:
    """The parent pid, from /proc/<pid>/stat (the field after the command's closing parenthesis)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def holder_of(pid: int, known: dict[int, str]) -> str | None:
    """The run/rank a process works for: its own, or its nearest worker ancestor's."""
    for _ in range(MAX_PARENTS):
        if pid in known:
            return known[pid]
        found = parent(pid)
        if found is None or found <= 1:
            return None
        pid = found
    return None
