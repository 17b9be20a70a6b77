"""Unmodified torchrun scripts (`launch --script train.py -- ARGS`) on real Ray, 2 CPU workers with gloo: the
same weights as torchrun, a killed rank restarting every rank from the script's own snapshot, and a crashing
rank named in one line."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch
import yaml
from conftest import DATA
from helpers import max_abs_diff, script_pids

import orchestrator
from groundwork.errors import RunFailed

SCRIPT = DATA / "scripts" / "ddp_tutorial.py"
EPOCHS = ["--epochs", "4", "--report"]  # orchestrator.report: rows here, nothing under torchrun


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def torchrun_weights(tmp_path_factory) -> dict[str, torch.Tensor]:
    """The reference: the same script under `torchrun --nproc-per-node 2`."""
    folder = tmp_path_factory.mktemp("torchrun")
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                    str(free_port()), str(SCRIPT), *EPOCHS], cwd=folder, check=True, capture_output=True,
                   timeout=300)
    return torch.load(folder / "final.pt", weights_only=True)


def test_a_torchrun_script_runs_unmodified_and_matches_torchrun(ray_local, in_tmp, torchrun_weights):
    run = orchestrator.launch(script=str(SCRIPT), args=EPOCHS, workers=2, name="tut", quiet=True)
    assert max_abs_diff(torchrun_weights, torch.load(in_tmp / "final.pt", weights_only=True)) == 0.0
    for rank in (0, 1):
        assert f"[rank {rank}] epoch 3 loss" in (run.path / "logs" / f"rank-{rank}.log").read_text()
    given = re.search(r"with (.*RANK=1 .*)", (run.path / "logs" / "rank-1.log").read_text()).group(1).split()
    assert {"LOCAL_RANK=1", "WORLD_SIZE=2", "TORCHELASTIC_RESTART_COUNT=0", "MASTER_ADDR=127.0.0.1"} <= set(given)
    # rank 0's orchestrator.report calls are the run's rows, the losses it printed
    printed = re.findall(r"\[rank 0\] epoch \d loss (\S+)", (run.path / "logs" / "rank-0.log").read_text())
    assert [r["step"] for r in run.rows] == [1, 2, 3, 4]
    assert [f"{r['loss']:.4f}" for r in run.rows] == printed
    assert (run.path / "metrics.parquet").exists() and (run.path / "loss.png").exists()
    saved = yaml.safe_load((run.path / "launch.yaml").read_text())
    assert saved["script"] == str(SCRIPT) and saved["args"] == EPOCHS


def test_a_killed_rank_restarts_every_rank_from_the_scripts_snapshot(ray_local, in_tmp, torchrun_weights):
    out: dict[str, object] = {}

    def run() -> None:
        try:
            out["run"] = orchestrator.launch(script=str(SCRIPT), args=[*EPOCHS, "--pause", "1"], workers=2,
                                             max_failures=1, name="killed", quiet=True)
        except Exception as exc:  # handed to the test's thread below
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (in_tmp / "snapshot.pt").exists():
        time.sleep(0.1)
    pid = script_pids(SCRIPT).get(1)
    assert pid is not None, "rank 1's script never ran"
    os.kill(pid, signal.SIGKILL)  # after the first snapshot
    thread.join()
    assert "error" not in out, out.get("error")
    log = (in_tmp / "runs" / "killed" / "logs" / "rank-1.log").read_text()
    assert "[rank 1] resuming from the snapshot at epoch" in log  # every rank restarted, from the snapshot
    assert max_abs_diff(torchrun_weights, torch.load(in_tmp / "final.pt", weights_only=True)) == 0.0


def test_a_crashing_rank_ends_the_launch_naming_it(ray_local, in_tmp):
    # (torch prefixes an uncaught error of a distributed process with its rank: "[rank1]: ")
    with pytest.raises(RunFailed, match=r"^rank 1 exited with code 1: (\[rank1\]: )?RuntimeError: rank 1 crashed at"):
        orchestrator.launch(script=str(SCRIPT), args=["--crash-at-epoch", "1"], workers=2, name="crash",
                            quiet=True)


def test_a_nan_report_ends_the_script_in_one_line(ray_local, in_tmp):
    with pytest.raises(RunFailed, match=r"^rank \d: NonFiniteLoss: the loss is not finite \(nan/inf\) at step 2"):
        orchestrator.launch(script=str(SCRIPT), args=[*EPOCHS, "--nan-at-epoch", "1"], workers=2, quiet=True)
    assert [p.name.split("-")[0] for p in (in_tmp / "runs").iterdir()] == ["ddp_tutorial"]  # named after it


def test_a_script_and_an_entry_are_one_too_many(tmp_path):
    from conftest import run_cli

    proc = run_cli("launch", "--entry", "helpers:user_entry", "--script", str(SCRIPT), cwd=tmp_path)
    assert proc.returncode == 2 and "give one of entry, script and module, not script and entry" in proc.stderr
    proc = run_cli("launch", "--script", "nope.py", "--", "--lr", "1", cwd=tmp_path)
    assert proc.returncode == 2 and "nope.py: no such script" in proc.stderr
    assert list(tmp_path.iterdir()) == []
