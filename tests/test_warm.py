"""Warm groups: the desk's protocol and a job's ending, in-process; and real sweeps on 2 CPUs where a trial's
NaN leaves the group serving, a killed worker costs one trial and one restart, and PBT hands a trial another
trial's weights with its mutated learning rate."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from conftest import DATA

import orchestrator
from orchestrator.raytrain.job import Job
from orchestrator.sweeps.config import SweepConfig
from orchestrator.warm.desk import GO, STOP, Assignment, Closed, Desk, Ended, Report, Row
from orchestrator.warm.reporter import GroupReporter, Stopped
from orchestrator.warm.worker import run_job
from trainables.checkpoint import save_state
from trainables.config import TrainConfig
from trainables.context import DistContext
from trainables.local import LocalReporter

ASHA = yaml.safe_load((DATA / "sweeps" / "asha_digits.yaml").read_text())
TINY = TrainConfig(model="digits-cnn", max_steps=4, log_every=2)


def test_desk_hands_a_job_to_the_group_and_relays_verdicts():
    desk = Desk()
    assert desk.claim("a") is True
    assert desk.claim("b") is False  # held
    seq = desk.submit("a", Job(name="a", train=TINY))
    handed = desk.next_job(1.0)
    assert isinstance(handed, Assignment) and handed.seq == seq and handed.job.name == "a"
    assert desk.next_job(0.1) is None  # handed out once

    desk.row(seq, {"step": 2.0})
    index = desk.report(seq, {"val_acc": 0.5}, None)
    assert desk.verdict(seq, index, 0.1) is None  # the client has not let it through yet
    assert desk.take("a", 1.0) == [Row({"step": 2.0}), Report(0, {"val_acc": 0.5}, None)]
    desk.ack("a", 0)
    assert desk.verdict(seq, 0, 1.0) == GO

    index = desk.report(seq, {"val_acc": 0.6}, None)
    desk.release("a")  # Tune stopped the trial
    assert desk.verdict(seq, index, 1.0) == STOP
    assert desk.claim("b") is False  # free only once the group has left the job
    desk.end(seq, Ended("stopped"))
    assert desk.claim("b") is True


def test_desk_frees_a_group_whose_client_went_silent():
    desk = Desk(lease_s=0.5)
    assert desk.claim("a") is True
    seq = desk.submit("a", Job(name="a", train=TINY))
    desk.next_job(1.0)
    index = desk.report(seq, {}, None)
    time.sleep(0.6)  # the client's actor was killed: no more calls from it
    assert desk.verdict(seq, index, 0.1) == STOP
    desk.join()  # a restarted group ends the job it had in flight
    assert desk.times_started() == 1
    assert desk.claim("b") is True
    desk.close("over")
    assert desk.claim("c") == "over"
    assert desk.next_job(0.1) == Closed("over")


def test_a_job_that_fails_by_its_own_fault_ends_with_its_error_and_a_bug_propagates(tmp_path, ray_local):
    """What lets a warm group serve on: JobErrors (raised alike on every rank) end the job, anything else
    fails the group. A resume whose every checkpoint is corrupt is the job's error, not the group's.
    (ray_local: run_job asks Ray for this node, which would start a Ray of its own, and the fixture's then fail.)"""
    ctx = DistContext()
    assert run_job(Job(name="ok", train=TINY), ctx, LocalReporter()) == Ended("done")

    nan = run_job(Job(name="nan", train=TINY.model_copy(update={"optimizer": "sgd", "lr": 1e9})), ctx,
                  LocalReporter())
    assert nan.how == "error" and nan.message.startswith("NonFiniteLoss: the loss is not finite")

    save_state({"w": torch.ones(100)}, tmp_path / "checkpoint_1")
    (tmp_path / "checkpoint_1" / "state.pt").write_bytes(b"cut short")
    corrupt = run_job(Job(name="corrupt", train=TINY, resume=(str(tmp_path / "checkpoint_1"),)), ctx,
                      LocalReporter())
    assert corrupt.how == "error" and corrupt.message.startswith("CheckpointError: no complete checkpoint")

    class Broken(LocalReporter):
        def log(self, row: dict[str, float]) -> None:
            raise KeyError("a bug")

    with pytest.raises(KeyError, match="a bug"):
        run_job(Job(name="bug", train=TINY), ctx, Broken())


def _step_until_told(reporter: GroupReporter, step: int) -> int:
    """Train on (progress at each new step) until the verdict comes; the step it came at."""
    for _ in range(2000):
        step += 1
        in_flight = reporter.in_flight
        reporter.progress(step)
        if in_flight and not reporter.in_flight:
            return step
        time.sleep(0.005)
    raise AssertionError("no verdict came")


def test_the_group_trains_on_while_the_client_decides_and_stops_when_told(tmp_path, ray_local):
    """A report does not wait for the client: the verdict is looked for at each new step; GO lets the job go on,
    a client that let go stops it at a step (its staged checkpoint removed), and a checkpoint waits for the
    verdict on the report before it."""
    ray = ray_local
    desk = ray.remote(num_cpus=0, max_concurrency=4)(Desk).remote()
    assert ray.get(desk.claim.remote("trial")) is True
    job = Job(name="trial", train=TINY, run_dir=str(tmp_path / "run"))
    ray.get(desk.submit.remote("trial", job))
    reporter = GroupReporter(desk, ray.get(desk.next_job.remote(1.0)), DistContext())

    def folder(name: str) -> str:
        return str(save_state({"w": torch.ones(3)}, tmp_path / name).parent)

    reporter.checkpoint({"step": 2.0, "val_acc": 0.5}, folder("checkpoint_a"))  # returns before any verdict
    assert reporter.in_flight and ray.get(desk.verdict.remote(1, 0, 0.0)) is None
    reporter.progress(2)  # validation batches repeat the report's step: not looked at
    [report] = [e for e in ray.get(desk.take.remote("trial", 1.0)) if isinstance(e, Report)]
    assert report.metrics["val_acc"] == 0.5 and Path(report.path, "state.pt").exists()
    ray.get(desk.ack.remote("trial", report.index))
    step = _step_until_told(reporter, 2)  # GO: nothing raised
    assert step > 2 and Path(report.path).exists()  # the client's to take

    reporter.checkpoint({"step": float(step)}, folder("checkpoint_b"))
    [second] = [e for e in ray.get(desk.take.remote("trial", 1.0)) if isinstance(e, Report)]
    ray.get(desk.release.remote("trial"))  # Tune stopped the trial
    with pytest.raises(Stopped):
        _step_until_told(reporter, step)
    assert not Path(second.path).exists()  # nobody will take it

    ray.get(desk.end.remote(1, Ended("stopped")))
    assert ray.get(desk.claim.remote("next")) is True
    after = Job(name="next", train=TINY, run_dir=str(tmp_path / "next"))
    ray.get(desk.submit.remote("next", after))
    reporter = GroupReporter(desk, ray.get(desk.next_job.remote(1.0)), DistContext())
    reporter.checkpoint({"step": 1.0}, None)
    ray.get(desk.release.remote("next"))
    with pytest.raises(Stopped):  # the next checkpoint first learns the verdict on this one
        reporter.checkpoint({"step": 1.0}, folder("checkpoint_c"))
    assert not (tmp_path / "checkpoint_c").exists() and not any(after.staging.glob("*"))
    ray.kill(desk)


def test_only_sweeps_whose_trials_share_a_shape_use_warm_groups():
    def on_warm_groups(**changes) -> bool:
        return SweepConfig.model_validate({**ASHA, **changes}).on_warm_groups

    assert on_warm_groups()
    assert not on_warm_groups(reuse_workers=False)
    assert not on_warm_groups(space={"workers": {"type": "choice", "values": [1, 2]}})
    assert not on_warm_groups(base={"entry": "helpers:user_entry"})


def _group_logs(sweep_dir: Path, rank: int) -> str:
    return "".join(p.read_text() for p in sweep_dir.glob(f"warm-groups/group-*/logs/rank-{rank}.log"))


def _kill_rank_1_in_trial(sweep_dir: Path, nth: int, done: threading.Event) -> None:
    """SIGKILL rank 1 of the warm group shortly after it starts its `nth` trial (the harness reads the logs
    to time the kill; the test asserts on the sweep's results)."""
    while not done.is_set():
        lines = _group_logs(sweep_dir, 1).splitlines()
        if sum("orchestrator.warm: job " in line and " ended (" not in line for line in lines) >= nth:
            pid = int(next(line for line in lines if "ready, pid" in line).rsplit(" ", 1)[1])
            time.sleep(0.5)
            os.kill(pid, signal.SIGKILL)
            return
        time.sleep(0.05)


def test_a_nan_trial_keeps_the_group_and_a_killed_worker_costs_one_trial(ray_local, in_tmp):
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
    assert result.warm_group_starts == [2]
    states = [pg["state"] for pg in ray_local.util.placement_group_table().values()]
    assert states and all(state == "REMOVED" for state in states), states


def test_pbt_continues_trials_from_others_weights_with_their_new_lr(ray_local, in_tmp):
    cfg = {**ASHA, "name": "pbt", "num_samples": 4, "space": {"lr": {"type": "loguniform", "low": 1e-4,
                                                                     "high": 1e-2}},
           "scheduler": {"type": "pbt", "perturbation_interval": 1},
           "base": {"workers": 1, "cpus_per_worker": 1,  # two 1-CPU groups: two trials at once
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
    checked = 0
    for target, _, _, donor_iter, _, new in mid_run:
        number = int(target.split("_")[0])  # the target's tag, "1_lr=0.0003", starts with its trial number
        rows = trials[trials["trial"].str.endswith(f"_{number:05d}") & (trials["training_iteration"] > donor_iter)]
        if rows.empty:  # Tune kept none of this trial's reports after that restore (1 run in ~8 here)
            continue
        # the clone trains on from the donor's epoch with its own, mutated lr
        assert ((rows["lr"] - new["lr"]).abs() < 1e-12).any(), (target, new["lr"], rows[["lr", "step"]])
        checked += 1
    assert checked, f"no clone's reports after its restore: {exploits}"
    assert result.best_metric > 0.9


def test_warm_groups_give_the_same_trials_as_fresh_worker_groups(ray_local, in_tmp):
    """Same seeds, same numbers, whether a trial gets its own new worker group or a warm group's second turn:
    nothing of one trial (weights, optimizer, RNG, data order) leaks into the next."""
    tables = {}
    for reuse in (True, False):
        cfg = {**ASHA, "name": f"reuse-{reuse}", "num_samples": 1, "scheduler": {"type": "fifo"},
               "space": {"lr": {"type": "grid", "values": [0.001, 0.003]}}, "reuse_workers": reuse,
               "base": {"workers": 2, "train": {"model": "digits-cnn", "epochs": 1}}}
        result = orchestrator.sweep(SweepConfig.model_validate(cfg), quiet=True)
        tables[reuse] = pd.read_parquet(result.path / "trials.parquet").sort_values("param_lr")
    assert (in_tmp / "sweeps" / "reuse-True" / "warm-groups").is_dir()
    assert not (in_tmp / "sweeps" / "reuse-False" / "warm-groups").exists()
    for column in ("val_acc", "val_loss", "step"):
        assert tables[True][column].tolist() == pytest.approx(tables[False][column].tolist(), abs=1e-6), column
