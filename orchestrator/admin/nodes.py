"""`orchestrator cluster up/down`: a real multi-node Ray on this machine, for tests and for trying a
cluster spec before renting one. Every node is its own `ray start` (its own raylet and node id) bound to
127.0.0.1; the head's address is written to a state file, and `down` stops exactly those processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cluster.plan import group_resource
from cluster.spec import ClusterSpec, NodeGroup
from groundwork.address import free_port
from groundwork.errors import ConfigError
from groundwork.localray import CLUSTER_STATE, kill_tree, live_address, temp_dir
from orchestrator.raytrain.auth import ensure_token


def cluster_env() -> dict[str, str]:
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
    env = {**cluster_env(), "ORCHESTRATOR_RUNTIME_ENV_DIR": f"runtime_resources_node{node}"}  # see raystart
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=180)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise ConfigError(f"ray start failed: {tail[0]}")


def up(spec: ClusterSpec, port: int = 6390, state_file: Path = CLUSTER_STATE,
       down_command: str = "orchestrator cluster down") -> str:
    """Start one Ray node per node of the spec (head first), record them in `state_file` and return the head's
    address."""
    if (running := live_address(state_file)) is not None:
        raise ConfigError(f"a local cluster is already up ({running}): run `{down_command}` first")
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
        kill_tree(temp_dir(port))  # what a start cut short left (a GCS whose dashboard failed holds the port)
        raise
    state_file.parent.mkdir(parents=True, exist_ok=True)
    state_file.write_text(json.dumps({"address": address, "port": port, "cluster": spec.name,
                                      "nodes": spec.num_nodes}))
    return address


def down(state_file: Path = CLUSTER_STATE, up_command: str = "orchestrator cluster up SPEC") -> str:
    """Stop the nodes `up` recorded in `state_file` (and nothing else) and forget them."""
    if not state_file.exists():
        raise ConfigError(f"no local cluster is up: start one with `{up_command}`")
    state = json.loads(state_file.read_text())
    kill_tree(temp_dir(state["port"]))
    state_file.unlink(missing_ok=True)
    return state["address"]
