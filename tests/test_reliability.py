"""Faults a run must survive or report: hangs, stragglers, non-finite losses, checkpoints killed mid-save or
corrupted. Pure decisions are tested without Ray; the rest with real processes."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.multiprocessing as mp
from conftest import REPO
from helpers import final_weights, straggler_rank

from groundwork.address import free_port
from groundwork.errors import NonFiniteLoss
from orchestrator.raytrain.sink import MetricsSink
from orchestrator.raytrain.watchdog import Beat, Beats, find_hang
from trainables.checkpoint import load_latest, move_checkpoint, save_state, verify
from trainables.config import TrainConfig
from trainables.data import build_datasets
from trainables.health import stragglers
from trainables.local import train_locally
from trainables.models import build_model
from trainables.run import dataset_of

FAST = {"model": "digits-cnn", "batch_size": 32, "log_every": 2}


def beat(rank: int, step: int, seen: float, moved: float, done: bool = False) -> Beat:
    return Beat(rank, pid=100 + rank, node="abcdef0123456789", step=step, ticks=step, seen_at=seen,
                moved_at=moved, done=done)


def test_no_hang_while_every_rank_moves():
    beats = {0: beat(0, 10, 99, 98), 1: beat(1, 10, 99, 97)}
    assert find_hang(beats, now=100, timeout=5) is None


def test_a_silent_rank_is_named_before_the_ranks_waiting_for_it():
    # rank 1 froze at t=90 (no beats); rank 0 still beats but is stuck in the all-reduce since t=91
    beats = {0: beat(0, 12, 99.5, 91), 1: beat(1, 12, 90, 90)}
    found = find_hang(beats, now=100, timeout=5)
    assert found == ("rank 1 (pid 101, node abcdef012345) stopped responding after step 12: no heartbeat for"
                     " 10 s (--hang-timeout 5)")


def test_a_live_but_stuck_run_names_the_lowest_step():
    beats = {0: beat(0, 13, 99.9, 80), 1: beat(1, 12, 99.9, 81), 2: beat(2, 13, 99.9, 80)}
    found = find_hang(beats, now=100, timeout=5)
    assert found is not None and found.startswith("rank 1 (pid 101, node abcdef012345) made no progress after"
                                                  " step 12 for 19 s")
    assert found.endswith("; rank 0 at step 13, rank 2 at step 13")


def test_the_rank_behind_is_named_even_before_its_own_clock_runs_out():
    # rank 0 reached step 2 and waits for rank 1, stuck at step 1 since a moment later (the same report)
    beats = {0: beat(0, 2, 99.9, 94.0), 1: beat(1, 1, 99.9, 95.5)}
    found = find_hang(beats, now=100, timeout=5)
    assert found is not None and found.startswith("rank 1 (pid 101, node abcdef012345) made no progress after"
                                                  " step 1 for 4 s")


def test_finished_ranks_are_not_hung():
    assert find_hang({0: beat(0, 66, 50, 50, done=True)}, now=100, timeout=5) is None


def test_beats_move_only_when_the_counter_does():
    beats = Beats()
    beats.add(0, pid=1, node="n", step=3, ticks=7, done=False, now=10)
    beats.add(0, pid=1, node="n", step=3, ticks=7, done=False, now=20)  # alive, not moving
    assert (beats.beats[0].seen_at, beats.beats[0].moved_at) == (20, 10)
    beats.add(0, pid=2, node="n", step=3, ticks=7, done=False, now=30)  # a restarted process starts afresh
    assert beats.beats[0].moved_at == 30


def test_the_sink_ends_a_hung_group_once_and_keeps_every_row():
    killed: list[str] = []
    sink = MetricsSink(kill=killed.append, dump=lambda beats: {r: f"stack of pid {b.pid}" for r, b in beats.items()})
    sink.push({"step": 1.0})
    sink.push({"step": 2.0})
    assert sink.since(1) == [{"step": 2.0}]
    sink.register(0, "worker-0")
    sink.register(1, "worker-1")
    sink.beat(0, pid=10, node="n", step=5, ticks=5, done=False)
    sink.beat(1, pid=11, node="n", step=5, ticks=5, done=False)
    assert sink.heartbeats()[1].pid == 11
    now = sink.heartbeats()[1].moved_at
    assert sink.end_if_hung(timeout=5, now=now + 1) is None and killed == []
    found = sink.end_if_hung(timeout=5, now=now + 10)
    assert found is not None and found.line.startswith("rank 0 (pid 10, node n) stopped responding after step 5")
    assert found.rank == 0 and found.stacks == {0: "stack of pid 10", 1: "stack of pid 11"}  # read before the kill
    assert sorted(killed) == ["worker-0", "worker-1"]  # the whole group, so that fit() fails or restarts
    assert sink.end_if_hung(timeout=5, now=now + 20) is None  # forgotten: a restarted group starts afresh


def test_stragglers_are_over_one_and_a_half_times_the_median():
    assert stragglers([1.0, 1.1, 0.9, 2.0]) == [3]
    assert stragglers([1.0, 1.4, 1.2]) == []
    assert stragglers([1.0]) == []


def test_non_finite_loss_stops_at_its_step_and_checkpoints_nothing(tmp_path):
    cfg = TrainConfig(**FAST, optimizer="sgd", lr=1e9, epochs=1, checkpoint_every=2)
    with pytest.raises(NonFiniteLoss, match=r"not finite \(nan/inf\) at step 3: lower --lr") as info:
        train_locally(cfg, tmp_path)
    assert info.value.step == 3
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == ["checkpoint_000000"]  # step 2's; step 3 went nan, so step 4's was never written
    assert all(torch.isfinite(w).all() for w in final_weights(tmp_path / kept[0]).values())


def test_skip_nonfinite_skips_those_steps_and_keeps_the_weights_finite(tmp_path):
    cfg = TrainConfig(**FAST, optimizer="sgd", lr=1e9, epochs=1, skip_nonfinite=True)
    metrics, reporter = train_locally(cfg, tmp_path)
    assert metrics["step"] == 44 and reporter.rows[-2]["skipped_steps"] >= 1
    weights = final_weights(reporter.checkpoints[-1])
    assert all(torch.isfinite(w).all() for w in weights.values())


def test_a_save_killed_midway_leaves_only_complete_checkpoints(tmp_path):
    code = f"from helpers import save_forever; save_forever({str(tmp_path)!r}, 64)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO / "tests")
    assert proc.stdout.readline().strip() == "0"  # one checkpoint is complete
    time.sleep(0.3)  # into a later save: each writes 64 MiB and hashes it
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = sorted(tmp_path.glob("checkpoint_*"))
    assert all(verify(p) is None for p in done)  # whatever the kill hit is not under a checkpoint name
    folder, state = load_latest(reversed(done))
    assert folder == done[-1] and state["position"]["step"] == len(done) - 1


def test_a_reported_checkpoint_is_moved_whole_or_left_where_it_was(tmp_path):
    # A warm group's checkpoint goes to its client every epoch: renamed on one file system (no copy).
    src = tmp_path / "ckpt-1"
    save_state({"position": {"step": 1}, "w": torch.ones(10)}, src)
    dest = move_checkpoint(src, tmp_path / "staging" / "checkpoint_1")  # its folder made as needed
    assert not src.exists() and verify(dest) is None and sorted(p.name for p in dest.parent.iterdir()) == [dest.name]
    again = tmp_path / "ckpt-2"
    save_state({"position": {"step": 2}, "w": torch.ones(10)}, again)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("in the way")  # a folder that cannot be replaced
    with pytest.raises(OSError):
        move_checkpoint(again, tmp_path / "taken")
    assert verify(again) is None and not list(tmp_path.glob(".partial-*"))  # the writer's folder, as it was


def test_a_corrupt_checkpoint_is_skipped_with_a_warning(tmp_path, caplog):
    for step in (1, 2):
        save_state({"position": {"step": step}, "w": torch.ones(1000)}, tmp_path / f"checkpoint_{step}")
    with (tmp_path / "checkpoint_2" / "state.pt").open("r+b") as f:  # flip bytes: same size, wrong hash
        f.seek(200)
        f.write(b"\xff" * 8)
    assert verify(tmp_path / "checkpoint_2") == "state.pt does not match its sha256 in the manifest"
    with caplog.at_level(logging.WARNING):
        folder, state = load_latest([tmp_path / "checkpoint_2", tmp_path / "checkpoint_1"])
    assert folder.name == "checkpoint_1" and state["position"]["step"] == 1
    assert "checkpoint_2: state.pt does not match its sha256" in caplog.text


def test_a_rank_with_slow_data_is_reported_as_a_straggler_and_the_other_waits_in_allreduce(tmp_path):
    out = tmp_path / "rows.json"
    mp.start_processes(straggler_rank, args=(2, free_port(), str(out)), nprocs=2, start_method="spawn")
    rows = json.loads(out.read_text())
    train = [r for r in rows if "stragglers" in r and r.get("val_loss") is None]
    assert [r["step"] for r in train] == [4, 8, 12]
    assert all(r["slowest_rank"] == 1 for r in train)
    # With 2 ranks the median is their mean, so the ratio is < 2: rank 1's share is ~10x rank 0's here.
    # The first window also holds rank 0's one-off start-up work, so it is left out.
    assert all(r["stragglers"] == "1" and 1.5 < r["slowest_rank_ratio"] < 2 for r in train[1:])
    # DDP's comm hook: every gradient goes through the all-reduce once per step (float32), and the fast rank
    # spends its wait for the slow one's gradients inside it (timed by the hook, trainables/parallel/comm.py).
    cfg = TrainConfig(model="digits-cnn")
    meta = build_datasets(cfg, dataset_of(cfg))[2]
    grad_mib = 4 * sum(p.numel() for p in build_model(cfg.model, meta, cfg).parameters()) / 2**20
    for r in train[1:]:
        assert r["allreduce_mib_per_step_mean"] == pytest.approx(grad_mib)
        assert r["allreduce_share_max_rank"] == 0 and 0.3 < r["allreduce_share_max"] <= 1
        slow_rank_ms = 2 * r["allreduce_ms_per_step_mean"] - r["allreduce_ms_per_step_max"]  # two ranks
        assert r["allreduce_ms_per_step_max"] > 3 * slow_rank_ms
