"""The CLI as a user meets it: bad flags are one line and exit 2; plan and doctor print real facts."""

from __future__ import annotations

import pytest
from conftest import run_cli


@pytest.mark.parametrize("args, text", [
    (["launch", "--workers", "0"], "workers: Input should be greater than or equal to 1"),
    (["launch", "--precision", "fp8"], "argument --precision: invalid choice: 'fp8'"),
    (["launch", "--epochs", "three"], "argument --epochs: invalid int value: 'three'"),
    (["launch", "--model", "vgg"], "model 'vgg' is unknown: choose one of"),
    (["launch", "--dataset", "parquet"], "dataset parquet needs data_path"),
    (["launch", "--data-path", "/nope.parquet", "--dataset", "parquet"], "data_path /nope.parquet: no such file"),
    (["launch", "--entry", "not an entry"], "is not module:function"),
    (["launch", "--entry", "no_such_module_x:f"], "entry 'no_such_module_x:f' cannot be loaded"),
    (["launch", "--resume", "never-ran"], "--resume never-ran: no run at"),
    (["launch", "--workers", "64"], "workers(64) x [cpus(1), gpus(0)] does not fit the cluster"),
    (["launch", "--gpus-per-worker", "1"], "gpus_per_worker=1 but no node has that many GPUs"),
    (["launch", "--config", "missing.yaml"], "missing.yaml: no such file"),
    (["launch", "--name", "a/b"], "is not a run name"),
    (["launch", "--stop-after-epochs", "5", "--epochs", "2"], "stop_after_epochs(5) > epochs(2)"),
    (["launch", "--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_launch_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, text):
    proc = run_cli(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert text in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_bad_config_file_names_its_line(tmp_path):
    (tmp_path / "bad.yaml").write_text("workers: 2\ntrain:\n  lr: -1\n")
    proc = run_cli("launch", "--config", "bad.yaml", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("orchestrator: error: bad.yaml:3: train.lr: Input should be greater than 0")


def test_plan_prints_resources_and_env(tmp_path):
    proc = run_cli("plan", "--workers", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "CPU=1" in proc.stdout and "gloo" in proc.stdout and "OMP_NUM_THREADS" in proc.stdout


def test_doctor_reports_versions():
    import torch

    proc = run_cli("doctor", "--no-ray")
    assert proc.returncode == 0, proc.stderr
    assert torch.__version__ in proc.stdout and "CUDA available" in proc.stdout
