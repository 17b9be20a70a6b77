"""Ray clusters this machine started for itself (`orchestrator cluster up`, `orchestrator up`): where their
state files are, whether their processes still run, and how to stop exactly them. Each cluster has its own
Ray temp folder, named on the command line of every process of it: that is how they are found (`ray stop` would
stop every Ray on the machine)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

HOME = Path.home() / ".orchestrator"
CLUSTER_STATE = HOME / "local-cluster.json"  # `orchestrator cluster up`
UP_STATE = HOME / "up.json"  # `orchestrator up`
IN_USE = HOME / "up-in-use"  # one file per launch running on `orchestrator up`'s Ray, named by its pid


def temp_dir(port: int) -> str:
    """The Ray temp folder of the local cluster whose head listens on `port`."""
    return f"/tmp/orchestrator-ray-{port}"


def pids_naming(text: str) -> list[int]:
    """The processes (other than this one) whose command line holds `text`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue  # exited while we looked
    return pids


def kill_tree(marker: str, grace_s: float = 10.0, rounds: int = 3) -> int:
    """SIGTERM, then SIGKILL after `grace_s`, every process naming `marker`, and again for any that started
    meanwhile (a raylet can start a worker between the listing and its own end); how many outlived it all."""
    for _ in range(rounds):
        pids = pids_naming(marker)
        if not pids:
            return 0
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + grace_s
            while (pids := [p for p in pids if Path(f"/proc/{p}").exists()]) and time.monotonic() < deadline:
                time.sleep(0.2)
    return len(pids_naming(marker))


def live_address(state_file: Path) -> str | None:
    """The address of the cluster `state_file` records if its processes are up; a file whose processes are gone
    (a reboot, a killed session) is stale and removed."""
    if not state_file.exists():
        return None
    state = json.loads(state_file.read_text())
    if pids_naming(temp_dir(state["port"])):
        return state["address"]
    state_file.unlink(missing_ok=True)
    return None


def started_here(address: str) -> bool:
    """Whether `address` is a cluster this machine's `cluster up` or `up` started (always with token auth)."""
    return address in (live_address(CLUSTER_STATE), live_address(UP_STATE))


def standing_address(spec_name: str) -> str | None:
    """The address of a running `orchestrator up` started with the cluster spec named `spec_name`, else None."""
    address = live_address(UP_STATE)
    with contextlib.suppress(OSError, ValueError, KeyError):
        if address is not None and json.loads(UP_STATE.read_text())["cluster"] == spec_name:
            return address
    return None


@contextlib.contextmanager
def in_use(address: str | None) -> Iterator[None]:
    """While a launch runs on `orchestrator up`'s Ray (at `address`), its idle clock stands still."""
    if address is None or address != live_address(UP_STATE):
        yield
        return
    marker = IN_USE / str(os.getpid())
    IN_USE.mkdir(parents=True, exist_ok=True)
    marker.touch()
    try:
        yield
    finally:
        marker.unlink(missing_ok=True)  # the folder's time becomes the launch's end: the idle clock restarts
