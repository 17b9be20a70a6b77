"""Multi-node on one machine: two real `ray start` nodes on 127.0.0.1 (own raylets, own node ids), a
2-worker DDP run with STRICT_SPREAD across them, launched through the CLI like a user would."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import DATA, run_cli
from helpers import final_weights, max_abs_diff, script_pids

from cluster.spec import load_spec
from groundwork.localray import CLUSTER_STATE as STATE
from groundwork.localray import kill_tree, temp_dir
from orchestrator.admin.nodes import cluster_env, down, up
from trainables.config import TrainConfig
from trainables.local import train_locally

TWO_NODES = DATA / "clusters" / "two_nodes.yaml"


@pytest.fixture(scope="module")
def two_nodes():
    if not STATE.exists():  # a state file left by a killed session, none of its processes alive: not a block
        STATE.parent.mkdir(parents=True, exist_ok=True)
        STATE.write_text(json.dumps({"address": "127.0.0.1:6399", "port": 6399, "cluster": "gone", "nodes": 2}))
    address = up(load_spec(TWO_NODES), port=6390)
    assert json.loads(STATE.read_text())["port"] == 6390
    yield address
    down()


def test_strict_spread_puts_one_worker_on_each_node_and_matches_one_process(two_nodes, tmp_path):
    steps = ["--optimizer", "sgd", "--lr", "0.05", "--max-steps", "6", "--batch-size", "16"]
    proc = run_cli("launch", "--cluster", str(TWO_NODES), "--workers", "2", "--placement", "strict-spread",
                   "--name", "spread", *steps, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "token authentication off" not in proc.stderr  # `cluster up` keeps it on
    # a quiet terminal: the bar, none of Ray's own lines (they stay in the logs; --verbose streams them)
    assert "step 6" in proc.stdout and "loss" in proc.stdout
    assert not [line for line in (proc.stdout + proc.stderr).splitlines()
                if "TrainController" in line or "TrainingReport" in line or "RayTrainWorker" in line]
    run_dir = tmp_path / "runs" / "spread"
    nodes = [re.search(r"on node ([0-9a-f]+)", (run_dir / "logs" / f"rank-{r}.log").read_text()).group(1)
             for r in (0, 1)]
    assert nodes[0] != nodes[1]  # one worker per node, two raylets
    latest = max(p for p in run_dir.glob("checkpoint_*") if p.is_dir())
    _, single = train_locally(TrainConfig(optimizer="sgd", lr=0.05, max_steps=6, batch_size=32), tmp_path / "one")
    assert max_abs_diff(final_weights(latest), final_weights(single.checkpoints[-1])) < 1e-5


def test_a_torchrun_script_spans_both_nodes(two_nodes, tmp_path):
    script = DATA / "scripts" / "ddp_tutorial.py"
    proc = run_cli("launch", "--cluster", str(TWO_NODES), "--workers", "2", "--placement", "strict-spread",
                   "--script", str(script), "--name", "script", "--", "--epochs", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logs = [(tmp_path / "runs" / "script" / "logs" / f"rank-{r}.log").read_text() for r in (0, 1)]
    nodes = [re.search(r"on node ([0-9a-f]+)", log).group(1) for log in logs]
    assert nodes[0] != nodes[1]  # one slot per node; the script's own gloo group formed across them
    assert all(f"[rank {r}] epoch 1 loss" in logs[r] for r in (0, 1)) and (tmp_path / "final.pt").exists()
    assert "[rank 0] [rank 0] epoch 1 loss" in proc.stdout  # rank 0's lines reach the terminal (from its log)
    assert "[rank 1]" not in proc.stdout and "RayTrainWorker" not in proc.stdout + proc.stderr


def test_ctrl_c_ends_every_rank_on_both_nodes(two_nodes, tmp_path):
    script = DATA / "scripts" / "ddp_tutorial.py"
    cli = subprocess.Popen([sys.executable, "-m", "orchestrator", "launch", "--cluster", str(TWO_NODES), "--workers",
                            "2", "--placement", "strict-spread", "--script", str(script), "--name", "ctrl-c", "--",
                            "--epochs", "1000", "--pause", "1"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (tmp_path / "snapshot.pt").exists():  # both ranks are training
        time.sleep(0.2)
    assert sorted(script_pids(script)) == [0, 1]
    # while they train, `top` names the run and rank on each node (one row per node: their ids differ)
    shown = run_cli("top", "--address", two_nodes, "--once").stdout.splitlines()
    held = [[line.split()[1] for line in shown if f"ctrl-c/{rank}" in line] for rank in (0, 1)]
    assert len(held[0]) == len(held[1]) == 1 and held[0] != held[1], shown
    cli.send_signal(signal.SIGINT)
    assert cli.wait(timeout=120) == 130 and "orchestrator: interrupted" in cli.stderr.read()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and script_pids(script):
        time.sleep(0.2)
    assert script_pids(script) == {}  # no rank left on either node
    assert not [p for p in os.popen("ps -eo args").read().splitlines() if "RayTrainWorker" in p]


def test_top_reads_every_node_of_the_cluster(two_nodes):
    proc = run_cli("top", "--address", two_nodes, "--once")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "orchestrator top: 2 node(s)" in proc.stdout
    rows = [line for line in proc.stdout.splitlines() if "127.0.0.1" in line]
    assert len(rows) == 2 and rows[0].split()[1] != rows[1].split()[1]  # two node ids, each read on its node
    assert all("no NVML" in row and "GiB" in row for row in rows)  # CPU nodes: memory, and no GPU columns


def test_cluster_up_twice_is_refused(two_nodes):
    proc = run_cli("cluster", "up", str(TWO_NODES))
    assert proc.returncode == 2 and "a local cluster is already up (127.0.0.1:6390)" in proc.stderr


def test_render_validates_against_rays_schema(tmp_path):
    out = tmp_path / "ray-cluster.yaml"
    proc = run_cli("cluster", "render", str(DATA.parent.parent / "cluster/examples/multi-node.yaml"), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    import yaml
    from ray.autoscaler._private.util import validate_config

    config = yaml.safe_load(out.read_text())
    validate_config(config)
    gpu = config["available_node_types"]["gpu"]
    assert gpu["resources"]["GPU"] == 8 and gpu["min_workers"] == 2
    assert "NCCL_IB_HCA=mlx5_0,mlx5_1,mlx5_2,mlx5_3" in gpu["worker_setup_commands"][0]
    assert config["provider"] == {"type": "local", "head_ip": "10.0.0.1", "worker_ips": ["10.0.0.2", "10.0.0.3"]}


def test_cluster_check_passes_and_prints_allreduce_bandwidth(two_nodes):
    proc = run_cli("cluster", "check", str(TWO_NODES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "FAIL" not in proc.stdout
    rates = re.findall(r"([\d,]+) KiB .*? ([\d,.]+) MB/s", proc.stdout)
    assert len(rates) >= 3 and all(float(bw.replace(",", "")) > 0 for _, bw in rates), proc.stdout


def test_cluster_check_names_a_missing_interface(two_nodes):
    proc = run_cli("cluster", "check", str(DATA / "clusters" / "two_nodes_bad_nic.yaml"))
    assert proc.returncode == 1
    assert "net ens9f1np1" in proc.stdout and "missing" in proc.stdout
    assert "cluster check failed: worker" in proc.stderr and "ens9f1np1" in proc.stderr


@pytest.fixture
def open_head():
    """A head node started with token auth off, as an old or careless cluster would be."""
    port = 6395
    command = [sys.executable, "-m", "orchestrator.admin.raystart", "start", "--head", "--port", str(port),
               "--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--include-dashboard=false",
               "--disable-usage-stats", "--temp-dir", temp_dir(port)]
    subprocess.run(command, env={**cluster_env(), "RAY_AUTH_MODE": "disabled"}, check=True, capture_output=True,
                   timeout=180)
    yield f"127.0.0.1:{port}"
    kill_tree(temp_dir(port))


def test_joining_a_cluster_without_token_auth_warns(open_head):
    proc = run_cli("doctor", "--address", open_head)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (f"orchestrator: warning: the Ray cluster at {open_head} has token authentication off: anyone who"
            " can reach it can run code on it") in proc.stderr


def test_a_fresh_machine_makes_its_token_for_embedded_ray_and_cluster_up(tmp_path):
    """No ~/.ray/auth_token yet: the first launch makes one (owner-only) with no warning from Ray, and
    `cluster up` finds it, so a driver joining that cluster is let in."""
    fresh = {"HOME": str(tmp_path / "home"), "RAY_AUTH_MODE": None}  # as on a machine that never ran Ray
    job = ["--workers", "1", "--max-steps", "2", "--batch-size", "16"]
    first = run_cli("launch", *job, "--name", "embedded", cwd=tmp_path, env=fresh)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "Token authentication" not in first.stderr + first.stdout
    token = tmp_path / "home" / ".ray" / "auth_token"
    assert len(token.read_text()) == 64 and token.stat().st_mode & 0o777 == 0o600
    (tmp_path / "home" / ".ray" / "auth_token").unlink()  # and `cluster up` on a machine without one
    spec = tmp_path / "one.yaml"
    spec.write_text("name: one\naddress: 127.0.0.1:6392\nstorage: {path: runs, shared: true}\nnode_groups:\n"
                    "  - {name: head, role: head, cpus: 1, network: {interfaces: [lo]}}\n")
    up_proc = run_cli("cluster", "up", str(spec), cwd=tmp_path, env=fresh)
    try:
        assert up_proc.returncode == 0, up_proc.stderr[-3000:]
        joined = run_cli("launch", "--cluster", str(spec), *job, "--name", "joined", cwd=tmp_path, env=fresh)
        assert joined.returncode == 0, joined.stderr[-3000:]
        assert token.stat().st_mode & 0o777 == 0o600
    finally:
        run_cli("cluster", "down", cwd=tmp_path, env=fresh)
