"""Sweeps on real Ray: ASHA over 2-worker trials on 2 CPUs, no leaked placement groups, resume after the
driver is killed. Config errors are one line, exit 2, before anything starts."""

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
import yaml
from conftest import DATA, run_cli

import orchestrator
from orchestrator.config import LaunchConfig
from orchestrator.sweeps.config import SweepConfig
from orchestrator.sweeps.results import write_boards
from orchestrator.sweeps.trials import trial_launch

ASHA = DATA / "sweeps" / "asha_digits.yaml"


def test_schema_is_json_schema():
    proc = run_cli("sweep", "--schema")
    schema = json.loads(proc.stdout)
    assert schema["title"] == "SweepConfig" and "space" in schema["properties"]


def test_asha_sweep_stops_trials_leaks_nothing_and_best_launches(ray_local, in_tmp):
    result = orchestrator.sweep(ASHA, quiet=True)
    trials = pd.read_parquet(result.path / "trials.parquet")
    assert trials["trial"].nunique() == 8
    assert trials["error"].isna().all()
    per_trial = trials.groupby("trial")["training_iteration"].max()
    assert (per_trial < 3).sum() >= 1 and (per_trial == 3).sum() >= 1  # ASHA stopped some, not all
    assert set(trials.loc[trials["stopped_early"], "trial"]) == set(per_trial[per_trial < 3].index)
    assert {"param_lr", "param_batch_size", "val_acc", "step"} <= set(trials.columns)
    assert result.best_metric == pytest.approx(trials["val_acc"].max())
    assert (result.path / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    # each trial's reports as a TensorBoard run of its own, read back with TensorBoard's reader; the only
    # event files of the sweep (Tune's own TensorBoard logger is off)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # deferred: test-only

    for trial, rows in trials.groupby("trial"):
        board = EventAccumulator(str(result.path / "tb" / trial))
        board.Reload()
        val_acc = board.Scalars("val_acc")
        assert [e.step for e in val_acc] == rows["step"].tolist()
        assert [e.value for e in val_acc] == pytest.approx(rows["val_acc"].tolist(), rel=1e-6)
    assert {p.relative_to(result.path).parts[0] for p in result.path.rglob("events.out.tfevents*")} == {"tb"}

    states = [pg["state"] for pg in ray_local.util.placement_group_table().values()]
    assert states and all(state == "REMOVED" for state in states), states

    best = yaml.safe_load((result.path / "best.yaml").read_text())
    assert best["train"]["lr"] == pytest.approx(result.best_config.train.lr)
    run = orchestrator.launch(config=str(result.path / "best.yaml"), name="best", quiet=True)
    assert run.metrics["val_acc"] >= 0.90


def test_trial_boards_are_written_anew_from_the_rows(tmp_path):
    """tb/<trial>/: each trial's curves against its steps at the reports' times, without its settings or how
    it ended; a resumed sweep rewrites them (no second event file repeating the first's points)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # deferred: test-only

    table = pd.DataFrame({"trial": ["a", "a", "b"], "training_iteration": [1, 2, 1], "step": [10, 20, 10],
                          "val_acc": [0.5, 0.625, 0.25], "timestamp": [1.7e9, 1.7e9 + 1, 1.7e9 + 2],
                          "stopped_early": [False, False, True], "param_lr": [0.1, 0.1, 0.2]})
    for _ in range(2):
        write_boards(table, tmp_path / "tb")
    assert sorted(len(list(run.iterdir())) for run in (tmp_path / "tb").iterdir()) == [1, 1]
    board = EventAccumulator(str(tmp_path / "tb" / "a"))
    board.Reload()
    assert [(e.step, e.value, e.wall_time) for e in board.Scalars("val_acc")] == [(10, 0.5, 1.7e9),
                                                                                   (20, 0.625, 1.7e9 + 1)]
    assert board.Tags()["scalars"] == ["val_acc"]


def _finished_trials(sweep_dir: Path) -> set[str]:
    """Trials that Tune's saved experiment state records as TERMINATED: only what Tune has recorded as
    finished can be kept by a resume (a trial that ended after the last state save runs again)."""
    done = set()
    for state_file in sweep_dir.glob("experiment_state-*.json"):
        try:
            trials = [json.loads(entry[0]) for entry in json.loads(state_file.read_text())["trial_data"]]
        except (json.JSONDecodeError, KeyError):
            continue  # being written
        done |= {t["trial_id"] for t in trials if t.get("status") == "TERMINATED"}
    return {d.name for d in sweep_dir.glob("trial_*") if any(t in d.name for t in done)}


def test_killed_sweep_resumes_without_rerunning_finished_trials(tmp_path):
    # Small batches (a trial ~3 s on warm groups): the kill lands while a trial runs, not after the sweep's end.
    cfg = {**yaml.safe_load(ASHA.read_text()), "name": "killed", "num_samples": 3, "scheduler": {"type": "fifo"},
           "base": {"workers": 2, "train": {"model": "digits-cnn", "epochs": 2, "batch_size": 8}}}
    cfg["space"] = {"lr": cfg["space"]["lr"]}  # the batch size stays small
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(cfg))
    sweep_dir = tmp_path / "sweeps" / "killed"
    driver = subprocess.Popen([sys.executable, "-m", "orchestrator", "sweep", "--config", "s.yaml", "--quiet"],
                              cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    deadline = time.monotonic() + 400
    while not _finished_trials(sweep_dir) and time.monotonic() < deadline and driver.poll() is None:
        time.sleep(0.2)
    finished = _finished_trials(sweep_dir)
    os.killpg(driver.pid, signal.SIGKILL)  # the driver and the Ray it started, mid-sweep
    driver.wait()
    assert finished, "no trial finished before the deadline"
    assert not (sweep_dir / "trials.parquet").exists()
    before = {name: (sweep_dir / name / "result.json").read_text() for name in finished}

    proc = run_cli("sweep", "--resume", "killed", "--quiet", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "RayTrainWorker" not in proc.stdout + proc.stderr  # quiet: the workers' lines stay in their logs
    trials = pd.read_parquet(sweep_dir / "trials.parquet")
    assert trials["trial"].nunique() == 3
    assert (trials.groupby("trial")["training_iteration"].max() == 2).all()
    assert (trials.groupby("trial").size() == 2).all()  # one row per epoch: nothing ran twice
    for name, text in before.items():
        assert (sweep_dir / name / "result.json").read_text() == text  # finished trials were not rerun


def test_optuna_search_runs_trials(ray_local, in_tmp):
    cfg = {**yaml.safe_load(ASHA.read_text()), "name": "optuna", "num_samples": 2, "search": "optuna",
           "scheduler": {"type": "fifo"}, "base": {"workers": 1, "train": {"model": "digits-cnn", "epochs": 1}}}
    from orchestrator.sweeps.config import SweepConfig

    result = orchestrator.sweep(SweepConfig.model_validate(cfg), quiet=True)
    trials = pd.read_parquet(result.path / "trials.parquet")
    assert trials["trial"].nunique() == 2 and trials["param_lr"].nunique() == 2
    assert trials["val_acc"].notna().all()


def test_a_trial_leaves_out_the_settings_that_do_nothing_in_it():
    """A launch refuses powersgd_rank without PowerSGD; a sweep over grad_compression with powersgd_rank in its
    space runs the other trials with the default rank, and the PowerSGD ones with the sampled rank."""
    with pytest.raises(ValueError, match="powersgd_rank 4 needs grad_compression powersgd .it is bf16.: add"):
        LaunchConfig.model_validate({"train": {"grad_compression": "bf16", "powersgd_rank": 4}})
    base = LaunchConfig.model_validate({"workers": 2, "train": {"model": "digits-cnn"}})
    assert trial_launch(base, {"grad_compression": "bf16", "powersgd_rank": 4}).train.powersgd_rank == 1
    powersgd = trial_launch(base, {"grad_compression": "powersgd", "powersgd_rank": 4, "lr": 0.01})
    assert (powersgd.train.powersgd_rank, powersgd.train.lr, powersgd.workers) == (4, 0.01, 2)
    assert trial_launch(base, {"strategy": "fsdp", "grad_compression": "bf16"}).train.grad_compression == "none"
    # In a sweep's base it may act with a searched setting; refused where nothing searched makes it act.
    sweep = {"base": {"train": {"powersgd_rank": 4}}, "space": {"grad_compression": {"type": "choice",
                                                                                   "values": ["bf16", "powersgd"]}}}
    swept = SweepConfig.model_validate(sweep).base
    assert trial_launch(swept, {"grad_compression": "powersgd"}).train.powersgd_rank == 4
    assert trial_launch(swept, {"grad_compression": "bf16"}).train.powersgd_rank == 1
    with pytest.raises(ValueError, match="powersgd_rank 4 needs grad_compression powersgd"):
        SweepConfig.model_validate({**sweep, "space": {"lr": {"type": "choice", "values": [0.1]}}})
