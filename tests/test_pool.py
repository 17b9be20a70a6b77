"""The warm pool: a worker group kept up on a real `cluster up` Ray, run on by launches that join it, through
the CLI as a user would. The pooled runs must be the runs a worker group of their own makes: same files,
same numbers, resumable from one to the other."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
from conftest import DATA, REPO, run_cli

from cluster.spec import load_spec
from orchestrator.admin.nodes import down, up

PORT = 6433
ADDRESS = f"127.0.0.1:{PORT}"
JOB = ["--workers", "2", "--optimizer", "sgd", "--lr", "0.05", "--quiet", "--address", ADDRESS]


@pytest.fixture(scope="module")
def local_cluster():
    up(load_spec(REPO / "cluster" / "examples" / "local.yaml"), port=PORT)
    yield ADDRESS
    down()


def launch(cwd: Path, *args: str):
    return run_cli("launch", *JOB, *args, cwd=cwd)


def pool_pids(run_dir: Path) -> list[int]:
    """The pid of the warm worker that ran rank 0 of each of this run's jobs (none: it ran on its own group)."""
    log = (run_dir / "logs" / "rank-0.log").read_text()
    return [int(pid) for pid in re.findall(r"on a warm group, pid (\d+)", log)]


def pool_pid(run_dir: Path) -> int | None:
    pids = pool_pids(run_dir)
    return pids[0] if pids else None


def rows(run_dir: Path) -> pd.DataFrame:
    return pd.read_parquet(run_dir / "metrics.parquet")


def test_launches_run_on_the_pool_and_resume_across_it(local_cluster, tmp_path):
    proc = run_cli("pool", "up", "--address", ADDRESS, "--workers", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"warm pool up at {ADDRESS}" in proc.stdout
    again = run_cli("pool", "up", "--address", ADDRESS, "--workers", "2", cwd=tmp_path)
    assert again.returncode == 2 and "a warm pool is already up" in again.stderr

    first = launch(tmp_path, "--epochs", "2", "--keep-checkpoints", "1", "--name", "a")
    assert first.returncode == 0, first.stderr[-3000:]
    run_a = tmp_path / "runs" / "a"
    assert pool_pid(run_a) is not None
    assert len(list(run_a.glob("checkpoint_*"))) == 1  # two reported, the older pruned
    assert (run_a / "launch.yaml").exists() and (run_a / "loss.png").exists()
    a = rows(run_a)
    assert a["epoch"].max() == 2 and a["val_acc"].dropna().iloc[-1] > 0.5  # 0.1 by chance
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # deferred: test-only

    board = EventAccumulator(str(run_a / "tb"))  # a pooled run's rows reach TensorBoard as an own group's do
    board.Reload()
    assert [e.step for e in board.Scalars("loss")] == a.dropna(subset=["loss"])["step"].tolist()
    assert "allreduce_share_mean" in a and json.loads((run_a / "summary.json").read_text())["allreduce_share"] > 0

    # A job that fails (a NaN loss) fails its launch in one line; the pool serves the next one.
    bad = launch(tmp_path, "--epochs", "1", "--lr", "1e9", "--name", "nan")
    assert bad.returncode == 1 and "run failed: NonFiniteLoss" in bad.stderr
    second = launch(tmp_path, "--epochs", "1", "--name", "b")
    assert second.returncode == 0, second.stderr[-3000:]
    assert pool_pid(tmp_path / "runs" / "b") == pool_pid(run_a)  # the same warm worker, not a new one

    # A resume whose every checkpoint is corrupt is the job's own error, not the group's: its launch fails in
    # one line and the pool serves the next job on the same workers (no restart).
    assert launch(tmp_path, "--epochs", "1", "--name", "c").returncode == 0
    for state in (tmp_path / "runs" / "c").glob("checkpoint_*/state.pt"):
        state.write_bytes(b"cut short")
    corrupt = launch(tmp_path, "--resume", "c", "--epochs", "2")
    assert corrupt.returncode == 1 and "run failed: CheckpointError: no complete checkpoint" in corrupt.stderr

    resumed = launch(tmp_path, "--resume", "a", "--epochs", "3")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed at epoch 2" in (run_a / "logs" / "rank-0.log").read_text()
    assert rows(run_a)["epoch"].max() == 3
    assert pool_pids(run_a) == [pool_pid(run_a)] * 2  # the same warm worker, after the NaN and the corrupt resume

    down_proc = run_cli("pool", "down", "--address", ADDRESS, cwd=tmp_path)
    assert down_proc.returncode == 0, down_proc.stderr[-3000:]
    assert run_cli("pool", "down", "--address", ADDRESS, cwd=tmp_path).returncode == 2

    # Without the pool: the same run on a worker group of its own gives the same numbers...
    own = launch(tmp_path, "--epochs", "2", "--keep-checkpoints", "1", "--name", "own")
    assert own.returncode == 0, own.stderr[-3000:]
    assert pool_pid(tmp_path / "runs" / "own") is None
    mine = rows(tmp_path / "runs" / "own")
    assert mine["val_loss"].dropna().tolist() == pytest.approx(a[a["epoch"] <= 2]["val_loss"].dropna().tolist())
    # ... and continues a pooled run from the checkpoint the pool wrote (Ray Train never saw it).
    cont = launch(tmp_path, "--resume", "b", "--epochs", "2")
    assert cont.returncode == 0, cont.stderr[-3000:]
    assert "resumed at epoch 1" in (tmp_path / "runs" / "b" / "logs" / "rank-0.log").read_text()


def test_pool_up_needs_a_running_cluster(tmp_path):
    proc = run_cli("pool", "up", "--workers", "2", cwd=tmp_path)
    assert proc.returncode == 2
    assert "a warm pool lives on a running Ray cluster: pass --address" in proc.stderr
    assert not (tmp_path / "runs").exists()
    bad = run_cli("pool", "up", "--cluster", str(DATA / "clusters" / "two_nodes.yaml"), "--workers", "0",
                  cwd=tmp_path)
    assert bad.returncode == 2 and "workers" in bad.stderr
