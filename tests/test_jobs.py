"""Detached runs (`launch --detach`, `orchestrator jobs`) on a `cluster up` cluster of two real `ray start`
nodes: the run is a Ray job that outlives the CLI which submitted it, and stops and resumes like a Ctrl-C'd
launch."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import DATA, run_cli
from helpers import final_weights, max_abs_diff

from cluster.spec import load_spec
from orchestrator.admin.nodes import down, up

TWO_NODES = DATA / "clusters" / "two_nodes.yaml"
SETTINGS = ["--cluster", str(TWO_NODES), "--workers", "2", "--optimizer", "sgd", "--lr", "0.05",
            "--batch-size", "16", "--epochs", "8"]


@pytest.fixture(scope="module")
def cluster():
    up(load_spec(TWO_NODES), port=6390)
    yield
    down()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("jobs")  # the user's folder: shipped as the job's working_dir


def submit(folder: Path, *args: str) -> str:
    proc = run_cli("launch", *args, "--detach", cwd=folder, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return re.search(r"submitted as job (\S+);", proc.stdout).group(1)


def jobs(folder: Path, *args: str):
    return run_cli("jobs", *args, "--cluster", str(TWO_NODES), cwd=folder, timeout=600)


def newest_checkpoint(run_dir: Path) -> Path:
    return max(p for p in run_dir.glob("checkpoint_*") if p.is_dir())


def state_of(run_dir: Path) -> str | None:
    path = run_dir / "state.json"
    return json.loads(path.read_text())["state"] if path.exists() else None


@pytest.fixture(scope="module")
def whole(cluster, folder) -> Path:
    """A detached run left to finish."""
    submit(folder, *SETTINGS, "--name", "whole")
    run_dir = folder / "runs" / "whole"
    assert state_of(run_dir) is None  # the CLI is gone and the run goes on without it
    waited = jobs(folder, "wait", "whole")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    return run_dir


def test_a_detached_run_finishes_without_its_cli_and_is_listed(folder, whole):
    assert state_of(whole) == "finished"
    assert {"metrics.parquet", "summary.json", "loss.png", "cluster.yaml"} <= {p.name for p in whole.iterdir()}
    logs = jobs(folder, "logs", "whole")
    assert "run whole done" in logs.stdout and "epoch 8" in logs.stdout
    listed = jobs(folder, "list")
    row = next(line for line in listed.stdout.splitlines() if " whole " in line)
    assert "SUCCEEDED" in row and "epoch 8" in row and "val_acc 0.9" in row


def test_jobs_stop_keeps_the_newest_checkpoint_and_resume_reaches_the_whole_runs_weights(folder, whole):
    submit(folder, *SETTINGS, "--name", "halted")
    run_dir = folder / "runs" / "halted"
    deadline = time.monotonic() + 300
    while not list(run_dir.glob("checkpoint_*")) and time.monotonic() < deadline:
        time.sleep(0.5)
    stopped = jobs(folder, "stop", "halted")
    assert stopped.returncode == 0 and "continue with --resume halted" in stopped.stdout, stopped.stderr
    assert state_of(run_dir) == "interrupted"  # stopped mid-run, as Ctrl-C stops a launch
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and _is_train_worker(p)]  # workers gone
    status = jobs(folder, "status", "halted")
    assert "STOPPED" in status.stdout and "epoch 8" not in status.stdout

    submit(folder, "--resume", "halted", "--cluster", str(TWO_NODES))
    assert jobs(folder, "wait", "halted").returncode == 0
    assert state_of(run_dir) == "finished"
    diff = max_abs_diff(final_weights(newest_checkpoint(whole)), final_weights(newest_checkpoint(run_dir)))
    assert diff < 1e-6


@pytest.mark.slow  # ~1.5 min; the detached launch above runs in the default suite
def test_a_detached_sweep_runs_its_trials_on_the_cluster(cluster, folder):
    (folder / "tiny.yaml").write_text(
        f"name: tiny\nbase: {{workers: 1, cluster: {TWO_NODES}, train: {{model: digits-cnn, epochs: 1}}}}\n"
        "space: {lr: {type: loguniform, low: 0.001, high: 0.01}}\nnum_samples: 2\nscheduler: {type: fifo}\n")
    proc = run_cli("sweep", "--config", "tiny.yaml", "--detach", cwd=folder, timeout=120)
    assert proc.returncode == 0 and "sweep tiny submitted as job" in proc.stdout, proc.stderr[-3000:]
    waited = jobs(folder, "wait", "tiny")
    assert waited.returncode == 0, jobs(folder, "logs", "tiny").stdout[-3000:]
    sweep_dir = folder / "sweeps" / "tiny"  # where `orchestrator sweep` run here would have put it
    trials = pq.read_table(sweep_dir / "trials.parquet").to_pylist()
    assert len({t["trial"] for t in trials}) == 2 and (sweep_dir / "best.yaml").exists()
    assert "sweep tiny done" in jobs(folder, "logs", "tiny").stdout


def test_jobs_of_an_unknown_run_is_refused_in_one_line(cluster, folder):
    proc = jobs(folder, "status", "nosuchrun")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "no orchestrator job or run named 'nosuchrun'" in proc.stderr


def _is_train_worker(proc: Path) -> bool:
    try:
        return b"RayTrainWorker" in (proc / "cmdline").read_bytes()
    except OSError:
        return False
