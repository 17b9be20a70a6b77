"""`orchestrator up` / `down`: a local Ray with a warm pool that outlives the launches on this machine. A launch
with no --address finds it and runs on its pool; the idle timeout ends it; `down` ends it; nothing is left
running. Through the CLI, as a user would."""

from __future__ import annotations

import json
import time

import pytest
from conftest import run_cli
from test_pool import pool_pid

from groundwork.localray import UP_STATE, kill_tree, pids_naming, temp_dir

IDLE_S = 20


@pytest.fixture
def nothing_up():
    """No `orchestrator up` before the test (a killed session's would answer its launches), and none after."""
    assert not UP_STATE.exists() or run_cli("down").returncode == 0
    yield
    if UP_STATE.exists():
        kill_tree(temp_dir(json.loads(UP_STATE.read_text())["port"]))
        UP_STATE.unlink(missing_ok=True)


def wait_gone(port: int, timeout_s: float) -> float:
    """Seconds until the state file is gone (the watcher ran `down`)."""
    started = time.monotonic()
    while UP_STATE.exists() and time.monotonic() - started < timeout_s:
        time.sleep(1)
    return time.monotonic() - started


def test_launches_find_up_and_its_idle_timeout_ends_it(nothing_up, tmp_path):
    proc = run_cli("up", "--workers", "2", "--idle-timeout", str(IDLE_S), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    state = json.loads(UP_STATE.read_text())
    address, port = state["address"], state["port"]
    assert address == f"127.0.0.1:{port}" and f"up at {address}" in proc.stdout
    again = run_cli("up", cwd=tmp_path)
    assert again.returncode == 2
    assert f"a local cluster is already up ({address}): run `orchestrator down`" in again.stderr

    pids = []
    for name in ("a", "b"):  # no --address: both find it, and run on its pool's one warm group
        run = run_cli("launch", "--epochs", "1", "--quiet", "--name", name, cwd=tmp_path)
        assert run.returncode == 0, run.stderr[-3000:]
        assert f"workers: the warm pool at {address}" in run.stderr
        assert (tmp_path / "runs" / name / "metrics.parquet").exists()
        pids.append(pool_pid(tmp_path / "runs" / name))
    assert pids[0] is not None and pids[0] == pids[1]

    waited = wait_gone(port, IDLE_S + 60)
    assert not UP_STATE.exists(), f"still up {waited:.0f} s after the last launch"
    deadline = time.monotonic() + 10  # the watcher removes the state file last, then exits
    while pids_naming(temp_dir(port)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pids_naming(temp_dir(port)) == []  # raylet, GCS, the pool's workers and the watcher itself


def test_down_ends_everything_up_started(nothing_up, tmp_path):
    proc = run_cli("up", "--workers", "1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    port = json.loads(UP_STATE.read_text())["port"]
    assert pids_naming("orchestrator.admin.idle") and set(pids_naming("orchestrator.admin.idle")) <= set(
        pids_naming(temp_dir(port)))  # the idle watcher runs, and names the cluster's folder
    down = run_cli("down")
    assert down.returncode == 0 and f"stopped the local Ray at 127.0.0.1:{port}" in down.stdout
    assert not UP_STATE.exists() and pids_naming(temp_dir(port)) == []
