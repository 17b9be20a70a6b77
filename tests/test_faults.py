"""Faults a run meets on real Ray (2 CPU workers): its storage filling up during a checkpoint, and Ctrl-C.
Each ends the run in one line and keeps the newest complete checkpoint; `--resume` then continues to the
very weights of a run that met neither."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from helpers import final_weights, max_abs_diff

import orchestrator
from groundwork.errors import RunFailed

JOB = {"model": "digits-cnn", "workers": 2, "epochs": 4, "batch_size": 8, "quiet": True}  # ~180 steps an epoch


@pytest.fixture(scope="module")
def whole(ray_local, tmp_path_factory):
    """The reference: the same job, uninterrupted."""
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path_factory.mktemp("whole"))
        yield orchestrator.launch(**JOB, name="whole")


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MiB tmpfs: room for one checkpoint (1.8 MiB: weights and Adam's moments) and the logs, not two."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3M", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_storage_ends_the_run_in_one_line_and_resume_continues(whole, small_disk, monkeypatch):
    monkeypatch.chdir(small_disk)
    with pytest.raises(RunFailed, match=r"the storage is full: no space left under .* then --resume full "
                                        r"continues from its newest complete checkpoint") as failed:
        orchestrator.launch(**JOB, name="full")
    assert "Traceback" not in str(failed.value) and "\n" not in str(failed.value)
    # more room (the disk, grown in place), then the run goes on from its first checkpoint
    subprocess.run(["mount", "-o", "remount,size=64M", str(small_disk)], check=True)
    rest = orchestrator.launch(resume="full", quiet=True)
    assert rest.metrics["epoch"] == JOB["epochs"]
    assert max_abs_diff(final_weights(whole.checkpoint), final_weights(rest.checkpoint)) == 0.0


def test_ctrl_c_keeps_the_newest_checkpoint_and_resume_continues(whole, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = subprocess.Popen([sys.executable, "-m", "orchestrator", "launch", "--model", "digits-cnn", "--workers",
                            "2", "--epochs", str(JOB["epochs"]), "--batch-size", "8", "--name", "ctrl-c",
                            "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    run = tmp_path / "runs" / "ctrl-c"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not list(run.glob("checkpoint_*/manifest.json")):
        time.sleep(0.1)  # the first epoch's checkpoint is whole
    cli.send_signal(signal.SIGINT)
    assert cli.wait(timeout=120) == 130
    err = cli.stderr.read()
    assert "orchestrator: interrupted: every rank stopped; continue with --resume ctrl-c" in err
    assert json.loads((run / "state.json").read_text())["state"] == "interrupted"
    assert pd.read_parquet(run / "metrics.parquet")["epoch"].max() < JOB["epochs"]  # rows up to the stop
    rest = orchestrator.launch(resume="ctrl-c", quiet=True)
    assert rest.metrics["epoch"] == JOB["epochs"]
    assert json.loads((run / "state.json").read_text())["state"] == "finished"
    assert max_abs_diff(final_weights(whole.checkpoint), final_weights(rest.checkpoint)) == 0.0
    assert Path(rest.path) == run
