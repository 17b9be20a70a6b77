"""Acceptance on real Ray: 2 workers, gloo, on CPU. One embedded Ray serves the whole module."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import run_cli
from helpers import final_weights, max_abs_diff

import orchestrator
from groundwork.errors import RunFailed
from trainables.checkpoint import checkpoints_in, verify
from trainables.config import TrainConfig
from trainables.local import train_locally
from trainables.metrics import LOOP_METRICS

DIGITS = {"model": "digits-cnn", "workers": 2, "quiet": True}


@pytest.fixture(scope="module")
def three_epochs(ray_local, tmp_path_factory):
    """The uninterrupted reference run: 2 workers, 3 epochs, seeded. Later tests run in its folder."""
    folder = tmp_path_factory.mktemp("runs")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        yield orchestrator.launch(**DIGITS, epochs=3, name="whole", mlflow=f"file:{folder / 'mlruns'}")


def test_two_workers_reach_90_percent_and_write_results(three_epochs):
    run = three_epochs
    assert run.metrics["val_acc"] >= 0.90
    frame = pd.read_parquet(run.path / "metrics.parquet")
    assert {"step", "epoch", "loss", "samples_per_s", "lr", "val_acc"} <= set(frame.columns)
    # every figure a sweep over the loop may name as its metric, and no other (stragglers: rank numbers)
    assert set(frame.columns) - {"stragglers"} <= LOOP_METRICS
    assert frame["step"].is_monotonic_increasing and frame["step"].iloc[-1] == 66  # 3 x (1437 // 2 // 32)
    assert frame["val_acc"].dropna().iloc[-1] == pytest.approx(run.metrics["val_acc"])
    # host telemetry of both ranks at each log point: plausible, and the extreme's rank named
    host = frame.dropna(subset=["rss_mib_max"])
    assert (host["rss_mib_mean"] > 50).all() and (host["rss_mib_max"] >= host["rss_mib_mean"]).all()
    assert host["cpu_pct_max"].between(0, 100 * os.cpu_count()).all() and (host["cpu_pct_mean"] > 0).any()
    assert set(host["rss_mib_max_rank"]) <= {0, 1}
    assert host["allreduce_share_max"].between(0, 1).all() and (host["allreduce_ms_per_step_mean"] > 0).all()
    # the run's summary: the same rows' figures, the first window (warm-up) left out of the means
    summary = json.loads((run.path / "summary.json").read_text())
    train = frame[frame["val_loss"].isna()]
    assert summary["samples_per_s"] == pytest.approx(train["samples_per_s"].iloc[1:].mean())
    assert summary["peak_rss_mib"] == host["rss_mib_max"].max() and 0 < summary["allreduce_share"] < 1
    assert run.summary == summary and (run.path / "host.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the same rows as TensorBoard scalars, read back with TensorBoard's own reader
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # deferred: test-only

    board = EventAccumulator(str(run.path / "tb"))
    board.Reload()
    losses = board.Scalars("loss")
    assert [e.step for e in losses] == frame.dropna(subset=["loss"])["step"].tolist()
    assert losses[-1].value == pytest.approx(frame["loss"].dropna().iloc[-1])
    assert "val_acc" in board.Tags()["scalars"] and "rss_mib_max" in board.Tags()["scalars"]
    # and in MLflow (a local file store, as offline as the test)
    from mlflow.tracking import MlflowClient  # deferred: test-only

    client = MlflowClient(tracking_uri=f"file:{run.path.parent.parent / 'mlruns'}")
    logged = client.search_runs([client.get_experiment_by_name("orchestrator").experiment_id])[0]
    assert logged.info.run_name == "whole" and logged.info.status == "FINISHED"
    history = client.get_metric_history(logged.info.run_id, "loss")
    assert [m.step for m in history] == [e.step for e in losses] and logged.data.params["train.epochs"] == "3"
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


def test_fsdp_sharded_checkpoints_written_in_the_background_on_ray_resume_under_ddp(three_epochs):
    """--checkpoint-async: epoch 1's checkpoint is written while epoch 2 trains; the folder every rank wrote
    into becomes Ray's checkpoint where it is (no copy). Epoch 2's is cut short, so the resume takes epoch 1's."""
    first = orchestrator.launch(**DIGITS, epochs=3, stop_after_epochs=2, strategy="fsdp", checkpoint_format="sharded",
                                checkpoint_async=True, name="sharded")
    assert (first.checkpoint / "shards" / ".metadata").exists()  # Ray kept the folder every rank wrote into
    assert not list(first.path.glob(".*sharded-step*"))  # nothing left half-written or unmoved
    newest, older = checkpoints_in(first.path)[:2]
    assert newest == first.checkpoint and verify(older) is None
    shard = next((newest / "shards").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:-100])
    # Under ddp the run's sharded-checkpoint settings would do nothing: the resume leaves them behind.
    rest = orchestrator.launch(resume="sharded", stop_after_epochs=None, strategy="ddp", quiet=True)
    assert rest.metrics["epoch"] == 3
    saved = yaml.safe_load((rest.path / "launch.yaml").read_text())["train"]
    assert (saved["strategy"], saved["checkpoint_format"], saved["checkpoint_async"]) == ("ddp", "full", False)
    assert max_abs_diff(final_weights(three_epochs.checkpoint), final_weights(rest.checkpoint)) < 1e-5


def test_new_run_with_an_existing_name_is_refused(three_epochs):
    from groundwork.errors import ConfigError

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
    run = orchestrator.launch(**DIGITS, entry="helpers:user_entry", user={"lr": 0.123}, name="entry")
    seen = [json.loads((run.path / f"entry-rank{r}.json").read_text()) for r in (0, 1)]
    assert [s["rank"] for s in seen] == [0, 1]
    assert all(s["world"] == 2 and s["lr"] == 0.123 and s["omp"] == "1" for s in seen)


def launch_and_signal(ray, name: str, rank: int, at_step: int, sig: signal.Signals,
                      **settings) -> tuple[Callable[[], object], int, int]:
    """Launch in a thread; when `rank`'s heartbeat passes `at_step`, send it `sig` by pid. Returns a function
    giving the launch's result (or raising its error), the pid signalled and the step it had reached."""
    out: dict[str, object] = {}

    def run() -> None:
        try:
            out["result"] = orchestrator.launch(**DIGITS, name=name, **settings)
        except Exception as exc:  # handed to the test's thread below
            out["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and thread.is_alive():
        try:
            beats = ray.get(ray.get_actor(f"orchestrator-sink-{name}").heartbeats.remote())
        except ValueError:  # the sink is not up yet
            beats = {}
        if rank in beats and beats[rank].step >= at_step:
            os.kill(beats[rank].pid, sig)
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"rank {rank} never reached step {at_step} while the run was alive")

    def result():
        thread.join()
        if "error" in out:
            raise out["error"]
        return out["result"]
    return result, beats[rank].pid, beats[rank].step


def test_a_killed_worker_restarts_from_its_checkpoint_and_ends_equal(three_epochs, ray_local):
    result, pid, step = launch_and_signal(ray_local, "killed", rank=1, at_step=20, sig=signal.SIGKILL,
                                          epochs=3, checkpoint_every=6, max_failures=1)
    run = result()
    assert max_abs_diff(final_weights(three_epochs.checkpoint), final_weights(run.checkpoint)) == 0.0
    log = (run.path / "logs" / "rank-1.log").read_text()
    assert f"pid {pid}," in log and log.count("rank 1 of 2") == 2  # the same rank, a second process
    resumed = [int(line.rsplit("step ", 1)[1]) for line in log.splitlines() if "resumed at epoch" in line]
    assert len(resumed) == 1 and 18 <= resumed[0] <= step + 6  # the last complete checkpoint before the kill
    frame = pd.read_parquet(run.path / "metrics.parquet")
    assert frame["step"].is_monotonic_increasing and frame["val_acc"].notna().sum() == 3  # replay deduped


def test_sigterm_to_a_worker_checkpoints_at_once_and_the_restart_is_not_a_failure(ray_local, tmp_path, monkeypatch):
    # As Kubernetes, SLURM or a spot VM's shutdown give notice; --max-failures 0: any failure would end the run.
    # Small batches (89 steps an epoch): the signal, sent when a heartbeat (every 0.5 s) shows step 20, lands
    # well before the last log point however fast the machine trains.
    monkeypatch.chdir(tmp_path)
    slow = {"epochs": 2, "batch_size": 8}
    reference = orchestrator.launch(**DIGITS, name="sigterm-reference", **slow)
    result, pid, step = launch_and_signal(ray_local, "sigterm", rank=1, at_step=20, sig=signal.SIGTERM,
                                          max_failures=0, **slow)
    run = result()
    assert max_abs_diff(final_weights(reference.checkpoint), final_weights(run.checkpoint)) == 0.0
    told = (run.path / "logs" / "rank-1.log").read_text()
    assert "SIGTERM: taken as a preemption notice" in told and f"pid {pid}," in told and told.count("rank 1 of 2") == 2
    assert told.count("SIGTERM: taken as") == 1  # Ray's own SIGTERM when it ends the group is Ray's to handle
    main = (run.path / "logs" / "rank-0.log").read_text()
    saved = [int(line.rsplit(" ", 1)[1]) for line in main.splitlines() if "about to be reclaimed: checkpoint" in line]
    resumed = [int(line.rsplit("step ", 1)[1]) for line in main.splitlines() if "resumed at epoch" in line]
    # Written when told (the next log point: mid-epoch, or an epoch end's checkpoint before it), and the rank
    # ends only once it is stored: the restart goes on from exactly there.
    assert len(saved) == 1 and saved[0] >= step and resumed == saved, (step, saved, resumed)
    assert "SIGTERM: taken as" not in main  # the ranks not told end with their group, at once


def test_resume_skips_a_corrupt_latest_checkpoint(three_epochs):
    first = orchestrator.launch(**DIGITS, epochs=3, stop_after_epochs=2, name="corrupt")
    newest, older = checkpoints_in(first.path)[:2]
    (newest / "state.pt").write_bytes((newest / "state.pt").read_bytes()[:1000])  # a save cut short
    rest = orchestrator.launch(resume="corrupt", stop_after_epochs=None, quiet=True)
    assert max_abs_diff(final_weights(three_epochs.checkpoint), final_weights(rest.checkpoint)) == 0.0
    log = (rest.path / "logs" / "rank-0.log").read_text()
    assert f"{newest.name}: state.pt has 1000 bytes" in log and f"resuming from {older}" in log


def test_a_frozen_rank_ends_the_run_naming_it(ray_local, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result, pid, step = launch_and_signal(ray_local, "frozen", rank=1, at_step=10, sig=signal.SIGSTOP,
                                          epochs=100, hang_timeout=3)
    started = time.monotonic()
    with pytest.raises(RunFailed, match=rf"^rank 1 \(pid {pid}, node \w+\) stopped responding after step \d+: "
                                        r"no heartbeat for \d+ s \(--hang-timeout 3\)"):
        result()
    assert time.monotonic() - started < 60  # not Ray's 30-minute collective timeout
    deadline = time.monotonic() + 30  # the frozen process is ended (Ray kills it asynchronously), not left
    while not process_gone(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert process_gone(pid)


def process_gone(pid: int) -> bool:
    try:
        return "(zombie)" in Path(f"/proc/{pid}/status").read_text()
    except OSError:  # no such process
        return True


def test_on_an_embedded_ray_the_controller_needs_no_runtime_env(ray_local):
    # Ray Train's controller gets a runtime env of the variables Ray passes it; without one it can take a
    # worker process Ray prestarted (~1 s of a new Python importing Ray). The embedded Ray starts with those
    # variables in every process, so a variable added to them without being set there is caught here.
    from orchestrator.raytrain.trainer import controller_env_in_place  # deferred: as the module's others

    assert controller_env_in_place()


def test_an_embedded_raylets_command_line_carries_the_worker_start_flags(ray_local):
    # Ray's raylet starts one worker process per CPU at a time (on 2 CPUs the second training worker waited
    # for the synchronization actor's process) and prestarts one per CPU; a launch has it prestart all it
    # needs, through the raylet's command line, which a stand-in rewrites (session.prestarting): a Ray that
    # renamed a flag would leave it as it was, caught here on the Ray of the tests (Ray's own values).
    from ray._private import ray_constants

    from orchestrator.raytrain.session import STARTING_AT_ONCE, prestarting

    raylet = ray_local._private.worker._global_node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0]
    command = Path(f"/proc/{raylet.process.pid}/cmdline").read_bytes().decode().split("\0")
    cpus = int(ray_local.cluster_resources()["CPU"])
    flags = {f"--maximum_startup_concurrency={min(os.cpu_count() or 1, cpus)}", f"--num_prestart_python_workers={cpus}"}
    assert flags <= set(command), [c for c in command if "startup" in c or "prestart" in c]
    started = []
    start = prestarting(cpus + 3, lambda command, process_type, *args, **kwargs: started.append(command))
    start(command, ray_constants.PROCESS_TYPE_RAYLET)
    start(["gcs_server", "--num_prestart_python_workers=1"], ray_constants.PROCESS_TYPE_GCS_SERVER)
    assert {f"--maximum_startup_concurrency={max(cpus + 3, STARTING_AT_ONCE)}",
            f"--num_prestart_python_workers={cpus + 3}"} <= set(started[0])
    assert len(started[0]) == len(command) and started[1] == ["gcs_server", "--num_prestart_python_workers=1"]


def test_an_embedded_ray_without_a_dashboard_sends_no_task_events(ray_local):
    # Ray's task events (each task's and actor's state changes, to the GCS every second) feed the State API and
    # the dashboard, which this Ray does not serve; and ray.shutdown waited for the driver's last batch. Every
    # process of it starts with them off (the raylet's environment, which its workers inherit).
    from ray._private import ray_constants

    from orchestrator.raytrain.session import NO_TASK_EVENTS

    raylet = ray_local._private.worker._global_node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0]
    environment = Path(f"/proc/{raylet.process.pid}/environ").read_bytes().decode().split("\0")
    assert {f"{name}={value}" for name, value in NO_TASK_EVENTS.items()} <= set(environment)


def test_a_worker_runtime_env_keeps_only_what_the_embedded_ray_lacks():
    from orchestrator.raytrain.embedded import held_env_only  # deferred: as the module's others

    held = {"OMP_NUM_THREADS": "1", "NCCL_IB_DISABLE": "1"}
    wanted = {"env_vars": {"OMP_NUM_THREADS": "1", "NCCL_IB_DISABLE": "0", "RAY_X": "y"}, "_nsight": "default"}
    assert held_env_only(wanted, held) == {"env_vars": {"NCCL_IB_DISABLE": "0", "RAY_X": "y"},
                                           "_nsight": "default"}  # a value that differs is still set
    assert held_env_only({"env_vars": {"OMP_NUM_THREADS": "1"}}, held) == {}  # nothing left: no runtime env


def test_a_quiet_launch_on_an_embedded_ray_starts_only_what_it_uses(tmp_path):
    # Ray Train's fixed-size policy starts Ray Data's AutoscalingCoordinator (an actor, a new Python
    # importing Ray Data) and waits for it, to ask an autoscaler for resources; a Ray the launch started has
    # neither an autoscaler nor a node to add. Ray's head would also start its autoscaler monitor, its API
    # server (the dashboard head, which ray.init waits for) and, for output nobody asked for, its log
    # monitor. Its workers need no runtime env (Ray would start each through a second Python, setup_worker.py,
    # after a round trip to its runtime-env agent): every variable they need is in every process of that
    # Ray already. Ray Train's controller runs in the driver (a process of its own would import Ray Train
    # first). Read from that Ray's own session logs (each process's log file, each actor's first line).
    from orchestrator.launcher.launch import OWN_GROUP_ACTORS  # deferred: as the module's others

    started = time.time()
    proc = run_cli("launch", "--workers", "1", "--max-steps", "2", "--batch-size", "16", "--quiet", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    session = Path("/tmp/ray/session_latest").resolve()
    assert session.stat().st_mtime >= started - 1  # the launch's own Ray, not an older one
    logs = session / "logs"
    actors = [line.split(":actor_name:")[1].strip() for out in logs.glob("worker-*.out")
              for line in out.read_text().splitlines()[:3] if ":actor_name:" in line]
    assert sorted(actors) == ["MetricsSink", "RayTrainWorker", "SynchronizationActor"], actors
    # the launch's actors, all in processes started as the driver connected: none killed for idling beyond
    # Ray's one per CPU while the driver went on, then started again (on more CPUs than actors, Ray's own
    # one per CPU are started, the rest idle)
    cpus = os.cpu_count() or 1
    assert len(actors) == 1 + OWN_GROUP_ACTORS, actors
    assert len(list(logs.glob("worker-*.out"))) == max(cpus, 1 + OWN_GROUP_ACTORS), actors
    assert not list(logs.glob("runtime_env_setup-*")), sorted(p.name for p in logs.iterdir())
    assert not [name for name in actors if "Autoscaling" in name], actors
    started_processes = {path.name.split(".")[0] for path in logs.iterdir()}
    assert {"gcs_server", "raylet"} <= started_processes
    assert not {"monitor", "dashboard", "log_monitor"} & started_processes, sorted(started_processes)
