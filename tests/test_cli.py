"""The CLI as a user meets it: bad flags are one line and exit 2; plan and doctor print real facts."""

from __future__ import annotations

from conftest import run_cli


def test_bad_launch_input_is_one_line_exit_2_and_writes_nothing(tmp_path):
    # One case end to end in a real subprocess; the whole corpus runs in test_bad_inputs.py.
    proc = run_cli("launch", "--workers", "0", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == ("orchestrator: error: settings: workers: Input should be greater than or equal"
                                   " to 1")
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
