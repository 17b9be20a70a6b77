"""Sweeps on warm worker groups ("gangs"): the desk's protocol with a real actor, and real sweeps on 2 CPUs
where a trial's NaN leaves the gang serving, a killed worker costs one trial and one restart, and PBT hands a
trial another trial's weights with its mutated learning rate."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import DATA

import orchestrator
from orchestrator.sweeps.config import SweepConfig
from orchestrator.sweeps.desk import GO, STOP, Desk

ASHA = yaml.safe_load((DATA / "sweeps" / "asha_digits.yaml").read_text())


def test_desk_hands_a_job_to_the_gang_and_relays_verdicts(ray_local):
    desk = Desk.remote()
    get = ray_local.get
    assert get(desk.claim.remote("a")) is True
    assert get(desk.claim.remote("b")) is False  # held
    seq = get(desk.submit.remote("a", {"x": 1}))
    job = get(desk.next_job.remote(1.0))
    assert job["x"] == 1 and job["seq"] == seq and job["trial_id"] == "a"
    assert get(desk.next_job.remote(0.1)) is None  # handed out once

    index = get(desk.report.remote(seq, {"val_acc": 0.5}, None))
    assert get(desk.verdict.remote(seq, index, 0.1)) is None  # the trial has not let it through yet
    (report,) = get(desk.take.remote("a", 1.0))
    assert report == {"kind": "report", "index": 0, "metrics": {"val_acc": 0.5}, "path": None}
    get(desk.ack.remote("a", 0))
    assert get(desk.verdict.remote(seq, 0, 1.0)) == GO

    index = get(desk.report.remote(seq, {"val_acc": 0.6}, None))
    get(desk.release.remote("a"))  # Tune stopped the trial
    assert get(desk.verdict.remote(seq, index, 1.0)) == STOP
    assert get(desk.claim.remote("b")) is False  # free only once the gang has left the job
    get(desk.end.remote(seq, "stopped"))
    assert get(desk.claim.remote("b")) is True


def test_desk_frees_a_gang_whose_trial_went_silent(ray_local):
    desk = Desk.remote(lease_s=0.5)
    get = ray_local.get
    assert get(desk.claim.remote("a")) is True
    seq = get(desk.submit.remote("a", {}))
    get(desk.next_job.remote(1.0))
    index = get(desk.report.remote(seq, {}, None))
    time.sleep(0.6)  # the trial's actor was killed: no more calls from it
    assert get(desk.verdict.remote(seq, index, 0.1)) == STOP
    get(desk.join.remote())  # a restarted gang ends the job it had in flight
    assert get(desk.claim.remote("b")) is True
    get(desk.close.remote("over"))
    assert get(desk.claim.remote("c")) == "over"
    assert get(desk.next_job.remote(0.1)) == {"closed": "over"}


def test_only_sweeps_whose_trials_share_a_shape_use_gangs():
    def on_gangs(**changes) -> bool:
        return SweepConfig.model_validate({**ASHA, **changes}).on_gangs

    assert on_gangs()
    assert not on_gangs(reuse_workers=False)
    assert not on_gangs(space={"workers": {"type": "choice", "values": [1, 2]}})
    assert not on_gangs(base={"entry": "helpers:user_entry"})


def _gang_logs(sweep_dir: Path, rank: int) -> str:
    return "".join(p.read_text() for p in sweep_dir.glob(f"gangs/gang-*/logs/rank-{rank}.log"))


def _kill_rank_1_in_trial(sweep_dir: Path, nth: int, done: threading.Event) -> None:
    """SIGKILL rank 1 of the gang shortly after it starts its `nth` trial."""
    while not done.is_set():
        lines = _gang_logs(sweep_dir, 1).splitlines()
        if sum("orchestrator.gangs: job " in line and " ended (" not in line for line in lines) >= nth:
            pid = int(next(line for line in lines if "ready, pid" in line).rsplit(" ", 1)[1])
            time.sleep(0.5)
            os.kill(pid, signal.SIGKILL)
            return
        time.sleep(0.05)


def test_a_nan_trial_keeps_the_gang_and_a_killed_worker_costs_one_trial(ray_local, in_tmp):
    cfg = {**ASHA, "name": "faults", "num_samples": 1, "scheduler": {"type": "fifo"},
           "space": {"lr": {"type": "grid", "values": [0.05, 1.0e9, 0.05, 0.05]}},
           "base": {"workers": 2, "train": {"model": "digits-cnn", "optimizer": "sgd", "epochs": 12,
                                            "log_every": 5}}}
    sweep_dir = in_tmp / "sweeps" / "faults"
    done = threading.Event()
    killer = threading.Thread(target=_kill_rank_1_in_trial, args=(sweep_dir, 3, done), daemon=True)
    killer.start()
    try:
        result = orchestrator.sweep(SweepConfig.model_validate(cfg), quiet=True)
    finally:
        done.set()
    errors = sorted(str(r.error) for r in result.results if r.error)
    assert len(errors) == 2, errors
    assert any("NonFiniteLoss" in e for e in errors), errors
    # The killed trial fails with what its surviving rank saw (its peer gone mid-collective), or, if the
    # kill landed between collectives, with the restarted group's note: both say the group failed.
    killed = [e for e in errors if "NonFiniteLoss" not in e]
    assert "the worker group failed in this job" in killed[0], killed
    trials = pd.read_parquet(result.path / "trials.parquet")
    finished = trials[trials["error"].isna()].groupby("trial")["val_acc"].last()
    assert len(finished) == 2 and (finished > 0.9).all(), finished
    # One start, one restart after the kill: the NaN trial did not cost a restart.
    assert _gang_logs(sweep_dir, 0).count("ready, pid") == 2
    states = [pg["state"] for pg in ray_local.util.placement_group_table().values()]
    assert states and all(state == "REMOVED" for state in states), states


def test_pbt_continues_trials_from_others_weights_with_their_new_lr(ray_local, in_tmp):
    cfg = {**ASHA, "name": "pbt", "num_samples": 4, "space": {"lr": {"type": "loguniform", "low": 1e-4,
                                                                     "high": 1e-2}},
           "scheduler": {"type": "pbt", "perturbation_interval": 1},
           "base": {"workers": 1, "cpus_per_worker": 1,  # two 1-CPU gangs: two trials at once
                    "train": {"model": "digits-cnn", "epochs": 6, "lr_schedule": "constant", "log_every": 5}}}
    result = orchestrator.sweep(SweepConfig.model_validate(cfg), quiet=True)
    assert not [r.error for r in result.results if r.error]
    trials = pd.read_parquet(result.path / "trials.parquet")
    # pbt_global.txt: one JSON list per exploit: target, donor, target's and donor's iteration, old, new config
    exploits = [json.loads(line) for line in (result.path / "pbt_global.txt").read_text().splitlines()]
    # Tune may keep a restored trial's reports only from its last restore on: check each target's last clone,
    # where the donor still had epochs to hand on.
    last = {e[0]: e for e in exploits}
    mid_run = [e for e in last.values() if e[3] < 6]
    assert mid_run, f"PBT cloned no trial mid-run: {exploits}"
    for target, _, _, donor_iter, _, new in mid_run:
        number = int(target.split("_")[0])  # the target's tag, "1_lr=0.0003", starts with its trial number
        rows = trials[trials["trial"].str.endswith(f"_{number:05d}") & (trials["training_iteration"] > donor_iter)]
        # the clone trains on from the donor's epoch with its own, mutated lr
        assert ((rows["lr"] - new["lr"]).abs() < 1e-12).any(), (target, new["lr"], rows[["lr", "step"]])
    assert result.best_metric > 0.9


def test_warm_gangs_give_the_same_trials_as_fresh_worker_groups(ray_local, in_tmp):
    """Same seeds, same numbers, whether a trial gets its own new worker group or a gang's second turn:
    nothing of one trial (weights, optimizer, RNG, data order) leaks into the next."""
    tables = {}
    for reuse in (True, False):
        cfg = {**ASHA, "name": f"reuse-{reuse}", "num_samples": 1, "scheduler": {"type": "fifo"},
               "space": {"lr": {"type": "grid", "values": [0.001, 0.003]}}, "reuse_workers": reuse,
               "base": {"workers": 2, "train": {"model": "digits-cnn", "epochs": 1}}}
        result = orchestrator.sweep(SweepConfig.model_validate(cfg), quiet=True)
        tables[reuse] = pd.read_parquet(result.path / "trials.parquet").sort_values("param_lr")
    assert (in_tmp / "sweeps" / "reuse-True" / "gangs").is_dir() and not (in_tmp / "sweeps" / "reuse-False" /
                                                                         "gangs").exists()
    for column in ("val_acc", "val_loss", "step"):
        assert tables[True][column].tolist() == pytest.approx(tables[False][column].tolist(), abs=1e-6), column
