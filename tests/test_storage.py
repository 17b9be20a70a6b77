"""Run folders away from the working folder: on a filesystem URI (file://, which takes the code path an s3://
or gs:// bucket takes: a staging copy, Ray Train's checkpoints uploaded, each resume reading them back) and on
a second mount point. A run stopped after one epoch and resumed there ends with the weights of an
uninterrupted run kept in a plain folder. 2 workers, gloo, on the embedded Ray."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import REPO, run_cli
from helpers import final_weights, max_abs_diff

import orchestrator
from groundwork.remote import open_uri
from trainables.checkpoint import MANIFEST_FILE, checkpoints_in

DIGITS = {"model": "digits-cnn", "workers": 2, "quiet": True}
RUN_FILES = ("launch.yaml", "metrics.parquet", "summary.json", "state.json", "loss.png", "logs/rank-0.log",
             "logs/rank-1.log")


@pytest.fixture(scope="module")
def uninterrupted(ray_local, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path_factory.mktemp("plain"))
        return orchestrator.launch(**DIGITS, epochs=2, name="whole")


def spec_with_storage(folder: Path, storage: str) -> str:
    spec = yaml.safe_load((REPO / "cluster" / "examples" / "local.yaml").read_text())
    spec["storage"] = {"path": storage}
    path = folder / "cluster.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def stop_then_resume(storage: str, tmp_path: Path, monkeypatch,
                     between: Callable[[], None] = lambda: None) -> tuple[object, object]:
    """One epoch of two, then (after `between`) --resume, from a working folder that holds nothing of the run."""
    spec = spec_with_storage(tmp_path, storage)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    first = orchestrator.launch(**DIGITS, cluster=spec, epochs=2, stop_after_epochs=1, name="away")
    between()
    rest = orchestrator.launch(resume="away", cluster=spec, stop_after_epochs=None, quiet=True)
    assert list(Path.cwd().iterdir()) == []  # no runs/ here
    return first, rest


def check_the_run_folder(run: Path, uninterrupted) -> None:
    for name in RUN_FILES:
        assert (run / name).is_file(), name
    assert [(c / MANIFEST_FILE).is_file() for c in checkpoints_in(run)] == [True, True]  # one per epoch, complete
    epochs = [r["epoch"] for r in pq.read_table(run / "metrics.parquet").to_pylist() if r.get("val_acc") is not None]
    assert epochs == [1, 2]  # both sessions' rows
    log = (run / "logs" / "rank-0.log").read_text()
    assert log.count("rank 0 of 2") == 2 and "resumed at epoch 1" in log  # both sessions' lines
    newest = checkpoints_in(run)[0]
    assert max_abs_diff(final_weights(uninterrupted.checkpoint), final_weights(newest)) == 0.0


def test_a_run_on_a_file_uri_keeps_everything_there_and_resumes_from_it(uninterrupted, tmp_path, monkeypatch):
    bucket = tmp_path / "bucket" / "runs"
    snapshot = bucket / "away" / "checkpoint_manager_snapshot.json"  # Ray Train's record, read from the URI

    def tear_the_snapshot() -> None:  # as a kill while it was written leaves it: Ray Train cannot start
        snapshot.write_bytes(snapshot.read_bytes()[:20])

    first, rest = stop_then_resume(f"file://{bucket}", tmp_path, monkeypatch, tear_the_snapshot)
    assert first.stored == rest.stored == f"file://{bucket}/away"
    assert len((bucket / "away" / "checkpoint_manager_snapshot.torn").read_bytes()) == 20  # set aside, there
    check_the_run_folder(bucket / "away", uninterrupted)
    log = (bucket / "away" / "logs" / "rank-1.log").read_text()
    assert f"resuming from file://{bucket}/away/checkpoint_" in log  # read back through pyarrow, not the path


def test_a_run_on_a_second_mount_point_resumes_there(uninterrupted, tmp_path, monkeypatch):
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second file system mounted at /dev/shm")
    storage = Path(tempfile.mkdtemp(dir=shm, prefix="orchestrator-test-"))
    try:
        first, rest = stop_then_resume(str(storage / "runs"), tmp_path, monkeypatch)
        assert rest.path == storage / "runs" / "away"
        check_the_run_folder(storage / "runs" / "away", uninterrupted)
    finally:
        shutil.rmtree(storage, ignore_errors=True)


@pytest.fixture
def s3_bucket(tmp_path):
    """An S3 endpoint on loopback (moto's server: S3's HTTP API, in this process) with a bucket; (the runs'
    URI, the credentials a process needs for it)."""
    server_module = pytest.importorskip("moto.server")
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_EC2_METADATA_DISABLED": "true"}
    query = f"endpoint_override={host}:{port}&scheme=http&region=us-east-1"
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        fs, _ = pafs.FileSystem.from_uri(f"s3://bucket?{query}&allow_bucket_creation=true")
        fs.create_dir("bucket")
        yield f"s3://bucket/runs?{query}", env
    server.stop()


@pytest.mark.slow  # ~1 min: two launches, each with an embedded Ray of its own
def test_a_run_on_an_s3_bucket_keeps_everything_there_and_resumes_from_it(s3_bucket, tmp_path):
    uri, env = s3_bucket
    spec = spec_with_storage(tmp_path, uri)
    (tmp_path / "cwd").mkdir()
    common = ["--cluster", spec, "--workers", "2"]
    first = run_cli("launch", *common, "--epochs", "2", "--stop-after-epochs", "1", "--name", "s3run",
                    cwd=tmp_path / "cwd", env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    rest = run_cli("launch", *common, "--resume", "s3run", "--stop-after-epochs", "2", cwd=tmp_path / "cwd", env=env)
    assert rest.returncode == 0, rest.stderr[-3000:]
    assert list((tmp_path / "cwd").iterdir()) == []
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        fs, base = pafs.FileSystem.from_uri(uri)
        found = {info.path.removeprefix(f"{base}/s3run/"): info for info in
                 fs.get_file_info(pafs.FileSelector(f"{base}/s3run", recursive=True))}
        assert set(RUN_FILES) <= set(found), sorted(found)
        assert len([p for p in found if p.startswith("checkpoint_") and p.endswith(f"/{MANIFEST_FILE}")]) == 2
        with fs.open_input_stream(f"{base}/s3run/logs/rank-0.log") as stream:
            log = stream.read().decode()
    assert "resuming from s3://bucket/runs/s3run/checkpoint_" in log and "resumed at epoch 1" in log
    assert f"results: {uri.replace('/runs?', '/runs/s3run?')}" in rest.stderr


def test_a_storage_uri_is_opened_once_per_process(tmp_path):
    # A run pushes to its URI again and again; opening an s3:// URI without a region asks S3 for it each time.
    uri = f"file://{tmp_path}/runs"
    assert open_uri(uri)[0] is open_uri(uri)[0] and open_uri(uri)[1] == f"{tmp_path}/runs"
