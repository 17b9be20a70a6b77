"""Elastic workers (`--workers MIN..MAX`, Train V2's elastic scaling) on a `cluster up` cluster of two real
`ray start` nodes with 1 CPU each: a node lost mid-run leaves a run that goes on with one worker from the
newest checkpoint, with the global batch kept; the node started again gives the next run two."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import DATA, run_cli
from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (  # Ray 2.60's
    _AutoscalingCoordinatorActor,
)

from cluster.spec import load_spec
from groundwork.localray import kill_tree, pids_naming
from orchestrator.admin.nodes import _node_args, _start, down, up

TWO_NODES = DATA / "clusters" / "two_nodes.yaml"
SECOND_NODE = "runtime_resources_node1"  # in the command line of every process of node 1 (see raystart)
STEPS_PER_EPOCH = 1437 // 32  # digits' training split at a global batch of 32 (2 x 16, or 1 x 16 x 2)


@pytest.fixture(scope="module")
def cluster():
    spec = load_spec(TWO_NODES)
    up(spec, port=6390)
    yield spec
    down()


def train_rows(run_dir) -> list[dict]:
    return [r for r in pq.read_table(run_dir / "metrics.parquet").to_pylist() if r.get("val_loss") is None]


@pytest.mark.slow  # ~3 min: Ray Train first waits 60 s for a group of 2 before it settles for 1
def test_a_run_loses_a_node_goes_on_with_one_worker_and_the_next_run_gets_two(cluster, tmp_path):
    cli = subprocess.Popen([sys.executable, "-m", "orchestrator", "launch", "--cluster", str(TWO_NODES), "--workers",
                            "1..2", "--epochs", "6", "--optimizer", "sgd", "--lr", "0.05", "--batch-size", "16",
                            "--name", "elastic"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    run_dir = tmp_path / "runs" / "elastic"
    deadline = time.monotonic() + 300
    while not list(run_dir.glob("checkpoint_*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert kill_tree(SECOND_NODE) == 0  # node 1's raylet, agents and the worker on it: gone at once
    out, err = cli.communicate(timeout=600)
    assert cli.returncode == 0, err[-3000:]
    rows = train_rows(run_dir)
    worlds = [r["world_size"] for r in rows]
    assert worlds[0] == 2 and worlds[-1] == 1 and worlds == sorted(worlds, reverse=True)
    last = pq.read_table(run_dir / "metrics.parquet").to_pylist()[-1]  # the last validation
    assert last["step"] == 6 * STEPS_PER_EPOCH  # the global batch stayed 32: as many steps as planned
    assert "1 worker(s), was 2" in out
    assert "batch_size 16 x grad_accum 2 per worker keeps the global batch at 32" in (
        run_dir / "logs" / "rank-0.log").read_text()

    worker = next(g for g in cluster.node_groups if g.name == "worker")
    _start(["--address", "127.0.0.1:6390", *_node_args(worker)], node=1)  # the node is back
    deadline = time.monotonic() + 120
    while "2 node(s)" not in run_cli("top", "--address", "127.0.0.1:6390", "--once").stdout:
        assert time.monotonic() < deadline, "the second node did not join again"
    # Ray Train's elastic policy sizes a new group by what Ray Data's AutoscalingCoordinator (an actor that
    # outlives runs) reserves for it, and that actor looks at the cluster's nodes again only every tick
    time.sleep(_AutoscalingCoordinatorActor.TICK_INTERVAL_S + 2)
    again = run_cli("launch", "--cluster", str(TWO_NODES), "--workers", "1..2", "--max-steps", "6", "--log-every", "3",
                    "--batch-size", "16", "--name", "regrown", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert {r["world_size"] for r in train_rows(tmp_path / "runs" / "regrown")} == {2}


def node_id(marker: str) -> str:
    """The Ray node id of the node whose raylet's command line holds `marker`."""
    for proc in Path("/proc").iterdir():
        try:
            line = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "raylet/raylet" in line and marker in line:
            return re.search(r"--node_id=([0-9a-f]+)", line).group(1)
    raise AssertionError(f"no raylet with {marker} in its command line")


def wait_for(path: Path, text: str, timeout_s: float = 300) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = re.search(text, path.read_text()) if path.exists() else None
        if found:
            return found.group(1)
        time.sleep(0.2)
    raise AssertionError(f"{text!r} never appeared in {path}")


@pytest.mark.slow  # ~2 min, and it needs the node the test above started again
def test_a_preemption_notice_checkpoints_at_once_and_the_run_goes_on_from_it(cluster, tmp_path):
    # 30 epochs (~1 s each here): Ray Train's preemption watcher polls every 5 s, and its notice must find the run
    cli = subprocess.Popen([sys.executable, "-m", "orchestrator", "launch", "--cluster", str(TWO_NODES), "--workers",
                            "1..2", "--epochs", "30", "--log-every", "5", "--name", "spot"], cwd=tmp_path,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    logs = tmp_path / "runs" / "spot" / "logs"
    wait_for(logs / "rank-1.log", r"(rank 1 of 2)")  # one worker on each node
    wait_for(logs / "rank-0.log", r"(first optimizer step done)")
    # As a cloud's spot reclaim does through Ray's autoscaler: node 1 is drained for preemption, with a deadline.
    drained = subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "drain-node", "--address", "127.0.0.1:6390",
                              "--node-id", node_id(SECOND_NODE), "--reason", "DRAIN_NODE_REASON_PREEMPTION",
                              "--reason-message", "spot reclaim", "--deadline-remaining-seconds", "20"],
                             capture_output=True, text=True, timeout=120, env={**os.environ, "RAY_AUTH_MODE": "token",
                                                                           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
    assert drained.returncode == 0, drained.stderr[-2000:]
    step = int(wait_for(logs / "rank-0.log", r"about to be reclaimed: checkpoint at step (\d+)"))
    assert step % STEPS_PER_EPOCH != 0  # written when told, not at an epoch's end
    for pid in pids_naming(SECOND_NODE):  # the cloud takes the node: gone at once, no goodbye to Ray
        os.kill(pid, signal.SIGKILL)
    out, err = cli.communicate(timeout=600)
    assert cli.returncode == 0, err[-3000:]
    assert int(wait_for(logs / "rank-0.log", r"resumed at epoch \d+, step (\d+)")) >= step  # nothing lost
    # (Ray 2.60 classes the death of a node killed after a preemption drain on loopback as a failed health
    # check, not a preemption: the restart is charged to the elastic run's budget of one per node it may lose.)


def test_workers_min_max_is_checked_before_ray_starts(tmp_path):
    for value, message in [("3..2", "workers 3..2: give 1 <= MIN <= MAX"),
                           ("1..x", "workers '1..x': give a count (2), or MIN..MAX")]:
        proc = run_cli("launch", "--workers", value, cwd=tmp_path)
        assert proc.returncode == 2 and message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    proc = run_cli("launch", "--workers", "1..2", "--strategy", "hsdp", cwd=tmp_path)
    assert proc.returncode == 2 and "elastic workers (1..2) need strategy ddp or fsdp" in proc.stderr
    assert not (tmp_path / "runs").exists()
