"""`orchestrator cluster up/down`: a real multi-node Ray on this machine, for tests and for trying a
cluster spec before renting one. Every node is its own `ray start` (its own raylet and node id) bound to
127.0.0.1; the head's address is written to a state file, and `down` stops exactly those processes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from cluster.plan import group_resource
from cluster.spec import ClusterSpec, NodeGroup
from groundwork.address import free_port
from groundwork.errors import ConfigError
from orchestrator.raytrain.auth import ensure_token

STATE = Path.home() / ".orchestrator" / "local-cluster.json"


def _env() -> dict[str, str]:
    # Token auth stays on: the head makes the token (~/.ray/auth_token), joining nodes must present it.
    # Ray's single-host switch: every process of the cluster (raylets, dashboard agents and their job agent,
    # workers) then takes 127.0.0.1 for this node's address instead of the LAN one, which nothing listens
    # on. `ray start` refuses to add a node under it; orchestrator.admin.raystart lifts that for itself.
    return {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def _node_args(group: NodeGroup) -> list[str]:
    resources = {group_resource(group.name): 1000}
    # Each node's dashboard agent needs its own HTTP port on one machine (Ray's default, 52365, is one).
    return ["--num-cpus", str(group.cpus), "--num-gpus", str(group.gpus.count),
            "--resources", json.dumps(resources), "--node-ip-address", "127.0.0.1",
            "--dashboard-agent-listen-port", str(free_port())]


def _start(args: list[str], node: int) -> None:
    command = [sys.executable, "-m", "orchestrator.admin.raystart", "start", *args]
    env = {**_env(), "ORCHESTRATOR_RUNTIME_ENV_DIR": f"runtime_resources_node{node}"}  # see raystart
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=180)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise ConfigError(f"ray start failed: {tail[0]}")


def temp_dir(port: int) -> str:
    """The cluster's own Ray temp folder: every process of it names it on its command line, which is how
    `down` finds them without touching another Ray on this machine (`ray stop` would stop them all)."""
    return f"/tmp/orchestrator-ray-{port}"


def up(spec: ClusterSpec, port: int = 6390) -> str:
    """Start one Ray node per node of the spec (head first) and return the head's address."""
    if STATE.exists():
        state = json.loads(STATE.read_text())
        if _pids_naming(temp_dir(state["port"])):
            raise ConfigError(f"a local cluster is already up ({state['address']}):"
                              " run `orchestrator cluster down` first")
        STATE.unlink()  # its processes are gone (a reboot, a killed session): the file is stale
    head = spec.head
    ensure_token()  # the head reads it, joining nodes and drivers present it (a fresh machine has none)
    # The dashboard serves Ray's Jobs API (`launch --detach`, `orchestrator jobs`): on loopback only.
    # Its own port (not Ray's 8265) lets two clusters run on one machine; clients read it from the cluster.
    address = f"127.0.0.1:{port}"
    others = [g for g in spec.node_groups for _ in range(g.count - (1 if g is head else 0))]
    try:
        _start(["--head", "--port", str(port), "--include-dashboard=true", "--dashboard-host", "127.0.0.1",
                "--dashboard-port", str(free_port()),
                "--disable-usage-stats", "--temp-dir", temp_dir(port), *_node_args(head)], node=0)
        for node, group in enumerate(others, start=1):
            _start(["--address", address, *_node_args(group)], node)
    except ConfigError:
        _kill_tree(temp_dir(port))  # what a start cut short left (a GCS whose dashboard failed holds the port)
        raise
    STATE.parent.mkdir(parents=True, exist_ok=True)
    STATE.write_text(json.dumps({"address": address, "port": port, "cluster": spec.name,
                                 "nodes": spec.num_nodes}))
    return address


def _pids_naming(text: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue  # exited while we looked
    return pids


def _kill_tree(marker: str, grace_s: float = 10.0) -> int:
    pids = _pids_naming(marker)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while (pids := [p for p in pids if Path(f"/proc/{p}").exists()]) and time.monotonic() < deadline:
            time.sleep(0.2)
    return len(pids)


def down() -> str:
    """Stop the nodes `up` started (and nothing else) and forget the local cluster."""
    if not STATE.exists():
        raise ConfigError("no local cluster is up: start one with `orchestrator cluster up SPEC`")
    state = json.loads(STATE.read_text())
    _kill_tree(temp_dir(state["port"]))
    STATE.unlink()
    return state["address"]
