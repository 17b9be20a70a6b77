"""Acceptance on real Ray: 2 workers, gloo, on CPU. One embedded Ray serves the whole module."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from helpers import final_weights, max_abs_diff

import orchestrator
from trainables.config import TrainConfig
from trainables.local import train_locally

DIGITS = {"model": "digits-cnn", "workers": 2, "quiet": True}


@pytest.fixture(scope="module")
def three_epochs(ray_local, tmp_path_factory):
    """The uninterrupted reference run: 2 workers, 3 epochs, seeded. Later tests run in its folder."""
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path_factory.mktemp("runs"))
        yield orchestrator.launch(**DIGITS, epochs=3, name="whole")


def test_two_workers_reach_90_percent_and_write_results(three_epochs):
    run = three_epochs
    assert run.metrics["val_acc"] >= 0.90
    frame = pd.read_parquet(run.path / "metrics.parquet")
    assert {"step", "epoch", "loss", "samples_per_s", "lr", "val_acc"} <= set(frame.columns)
    assert frame["step"].is_monotonic_increasing and frame["step"].iloc[-1] == 66  # 3 x (1437 // 2 // 32)
    assert frame["val_acc"].dropna().iloc[-1] == pytest.approx(run.metrics["val_acc"])
    assert (run.path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    logs = sorted(p.name for p in (run.path / "logs").iterdir())
    assert logs == ["rank-0.log", "rank-1.log"]
    assert "[rank 1]" in (run.path / "logs" / "rank-1.log").read_text()


def test_resume_after_one_epoch_matches_uninterrupted(three_epochs):
    first = orchestrator.launch(**DIGITS, epochs=3, stop_after_epochs=1, name="split")
    assert first.metrics["epoch"] == 1
    rest = orchestrator.launch(resume="split", stop_after_epochs=None, quiet=True)
    assert rest.metrics["epoch"] == 3
    diff = max_abs_diff(final_weights(three_epochs.checkpoint), final_weights(rest.checkpoint))
    assert diff == 0.0
    frame = pd.read_parquet(rest.path / "metrics.parquet")
    assert frame["val_acc"].notna().sum() == 3  # one validation row per epoch, across both sessions


def test_new_run_with_an_existing_name_is_refused(three_epochs):
    from trainables.errors import ConfigError

    with pytest.raises(ConfigError, match="run 'whole' already exists .* --resume whole"):
        orchestrator.launch(**DIGITS, name="whole")


def test_ddp_equals_one_process_on_the_same_global_batch(ray_local, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    steps = {"optimizer": "sgd", "lr": 0.05, "max_steps": 8}
    ddp = orchestrator.launch(**DIGITS, batch_size=16, name="ddp", **steps)
    _, single = train_locally(TrainConfig(model="digits-cnn", batch_size=32, **steps), tmp_path / "single")
    diff = max_abs_diff(final_weights(ddp.checkpoint), final_weights(single.checkpoints[-1]))
    assert diff < 1e-5
    # and 8 steps really moved the weights: the match is not the trivial one of an untrained model
    _, one = train_locally(TrainConfig(model="digits-cnn", batch_size=32, **{**steps, "max_steps": 1}),
                           tmp_path / "one")
    assert max_abs_diff(final_weights(ddp.checkpoint), final_weights(one.checkpoints[-1])) > 1e-3


def test_user_entry_runs_in_every_worker(ray_local, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = orchestrator.launch(**DIGITS, entry="helpers:user_entry", lr=0.123, name="entry")
    seen = [json.loads((run.path / f"entry-rank{r}.json").read_text()) for r in (0, 1)]
    assert [s["rank"] for s in seen] == [0, 1]
    assert all(s["world"] == 2 and s["lr"] == 0.123 and s["omp"] == "1" for s in seen)
