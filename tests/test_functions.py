"""Ray-style train functions (`--entry`) as first-class runs, on real Ray with 2 workers: their reports become
the run's rows, their defaults are kept, a killed rank resumes from the function's own checkpoint, hangs and
nan losses end the run in one line, and a sweep searches the function's own settings."""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import DATA, run_cli
from test_ray_train import launch_and_signal

import orchestrator
from groundwork.errors import RunFailed
from trainables.checkpoint import checkpoints_in

TWO = {"workers": 2, "quiet": True}


def rows(run) -> pd.DataFrame:
    return pd.read_parquet(run.path / "metrics.parquet")


def test_a_function_written_as_ray_teaches_runs_unmodified(ray_local, in_tmp):
    run = orchestrator.launch(entry="helpers:ray_docs_train_func", user={"epochs": 4}, name="docs", **TWO)
    frame = rows(run)
    assert frame["report"].tolist() == [1, 2, 3, 4] and frame["epoch"].tolist() == [0, 1, 2, 3]
    assert (frame["lr_used"] == 1e-2).all()  # its own default: nothing set lr
    assert frame["loss"].is_monotonic_decreasing
    assert run.metrics["loss"] == pytest.approx(frame["loss"].iloc[-1])
    assert (run.path / "loss.png").read_bytes()[:4] == b"\x89PNG"
    checkpoints = checkpoints_in(run.path)
    assert len(checkpoints) == 2  # epochs 1 and 3 (keep_checkpoints 2), each with the loop's manifest
    manifest = json.loads((checkpoints[0] / "manifest.json").read_text())["files"]
    assert {"model.pt", "orchestrator_reports.json"} <= set(manifest)
    log = (run.path / "logs" / "rank-1.log").read_text()
    assert "epoch 3 loss" in log  # each rank's print, in its log
    assert "checkpoints reported: 2" in log  # a function's controller answers its workers (an actor's)


def test_a_killed_rank_resumes_from_the_functions_own_checkpoint(ray_local, in_tmp):
    whole = orchestrator.launch(entry="helpers:ray_docs_train_func", user={"epochs": 6}, name="whole", **TWO)
    result, _, _ = launch_and_signal(ray_local, "killed", rank=1, at_step=3, sig=signal.SIGKILL,
                                     entry="helpers:ray_docs_train_func", user={"epochs": 6, "pause_s": 0.5},
                                     max_failures=1)
    run = result()
    assert "resumed at epoch" in (run.path / "logs" / "rank-1.log").read_text()
    frame = rows(run)
    assert frame["epoch"].tolist() == list(range(6))  # the replayed reports replaced the first tries
    assert frame["loss"].tolist() == pytest.approx(rows(whole)["loss"].tolist(), rel=1e-6)


def test_a_rank_hung_in_a_collective_is_named_with_its_stack(ray_local, in_tmp):
    with pytest.raises(RunFailed, match=r"^rank 1 \(pid \d+, node \w+\) made no progress after step 1 .*"
                                        r"\(--hang-timeout 3\).*; rank 1 is in all_reduce "
                                        r"\(.*distributed_c10d.py:\d+\); stacks in .*hang"):
        orchestrator.launch(entry="helpers:hang_in_all_reduce_on_rank_1", hang_timeout=3, name="hang", **TWO)
    stacks = in_tmp / "runs" / "hang" / "hang"
    assert "hang_in_all_reduce_on_rank_1" in (stacks / "rank-1.txt").read_text()  # py-spy's dump, read before the kill
    assert "all_reduce (torch" not in (stacks / "rank-0.txt").read_text()  # rank 0 waits elsewhere
    assert (in_tmp / "runs" / "hang" / "metrics.parquet").exists()  # the rows of a failed run are kept


def test_a_nan_loss_in_a_function_ends_the_run_as_the_loops_would(ray_local, in_tmp):
    # the function takes no config argument, as TorchTrainer allows; both ranks fail alike (Ray Train reports
    # the one it hears of first)
    expect = r"^rank (\d): NonFiniteLoss: the loss is not finite \(nan/inf\) at step 2: "
    with pytest.raises(RunFailed, match=expect) as failed:
        orchestrator.launch(entry="helpers:nan_train_func", name="nan", **TWO)
    rank = re.match(expect, str(failed.value)).group(1)
    log = (in_tmp / "runs" / "nan" / "logs" / f"rank-{rank}.log").read_text()
    assert "Traceback" in log and "NonFiniteLoss" in log  # the failing rank's traceback, in its own log


def test_a_run_that_never_trained_leaves_no_folder_and_names_its_traceback(ray_local, in_tmp):
    # (both ranks fail alike; Ray Train reports the one it hears of first)
    with pytest.raises(RunFailed, match=r"^rank \d: KeyError: 'no_such_setting' \(traceback: (\S+/rank-\d.log)\);"
                                        r" it never trained, so \S+/runs/broken was removed$") as failed:
        orchestrator.launch(entry="helpers:fails_before_training", name="broken", **TWO)
    log = Path(re.search(r"traceback: (\S+)\)", str(failed.value)).group(1)).read_text()
    assert "Traceback" in log and "KeyError: 'no_such_setting'" in log  # the whole traceback, in the rank's log
    assert not (in_tmp / "runs" / "broken").exists()  # a rerun under the name is not refused


def test_a_function_reads_ray_data_datasets(ray_local, in_tmp):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": list(range(100))}), in_tmp / "rows.parquet")
    run = orchestrator.launch(entry="helpers:read_shard", datasets={"rows": str(in_tmp / "rows.parquet")},
                              workers=1, cpus_per_worker=1, quiet=True, name="data")  # a CPU left for Ray Data
    assert run.metrics["rows_seen"] == 100


def test_a_sweep_searches_a_functions_own_settings(ray_local, in_tmp):
    from orchestrator.sweeps.config import SweepConfig

    cfg = {"name": "fn", "metric": "loss", "mode": "min", "num_samples": 1, "scheduler": {"type": "fifo"},
           "space": {"user.lr": {"type": "grid", "values": [1e-3, 2e-2]}},
           "base": {"workers": 2, "entry": "helpers:ray_docs_train_func", "user": {"epochs": 3}}}
    result = orchestrator.sweep(SweepConfig.model_validate(cfg), quiet=True)
    trials = pd.read_parquet(result.path / "trials.parquet")
    assert sorted(trials["param_user.lr"].unique()) == [1e-3, 2e-2] and "loss" in trials
    assert result.best_config.user == {"epochs": 3, "lr": 2e-2}  # the larger step descends faster
    assert (result.path / "sweep.png").exists()
    best = yaml.safe_load((result.path / "best.yaml").read_text())
    assert best["entry"] == "helpers:ray_docs_train_func" and best["user"]["lr"] == 2e-2


@pytest.mark.parametrize("entry, expect", [
    ("helpers:json", "cannot be called as train_func(config) or train_func()"),
    ("helpers:max_abs_diff", "cannot be called as train_func(config) or train_func()"),
])
def test_a_function_with_a_wrong_signature_is_refused_before_ray_starts(tmp_path, entry, expect):
    proc = run_cli("launch", "--entry", entry, cwd=tmp_path)
    assert proc.returncode == 2 and expect in proc.stderr, proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_datasets_feed_only_functions(tmp_path):
    (tmp_path / "l.yaml").write_text(f"datasets: {{rows: {DATA / 'sweeps' / 'asha_digits.yaml'}}}\n")
    proc = run_cli("launch", "--config", "l.yaml", cwd=tmp_path)
    assert proc.returncode == 2 and "datasets: Ray Data datasets feed an `entry` function" in proc.stderr
