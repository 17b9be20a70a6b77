"""`orchestrator jobs list|status|logs|stop|wait`: this cluster's detached runs, by run name or Ray job id.
Progress and the best metric come from the run folder (the checkpoints Ray Train recorded), so a job that
ended, or a cluster restarted since, still shows what its run reached."""

from __future__ import annotations

import asyncio
import io
import json
import sys
import time
from datetime import datetime

import pyarrow.parquet as pq
from ray.job_submission import JobDetails, JobStatus, JobSubmissionClient
from rich.console import Console
from rich.table import Table

from groundwork.remote import RunPlace
from orchestrator.jobs.client import find_job, our_jobs, run_dir_of
from orchestrator.launcher.launch import RAY_SNAPSHOT
from orchestrator.launcher.results import METRICS_FILE

EXIT_OF_STATE = {JobStatus.SUCCEEDED: 0, JobStatus.FAILED: 1, JobStatus.STOPPED: 130}


def progress(place: RunPlace) -> tuple[str, str]:
    """(how far the run got, its best validation metric): from its rows once it ended, else from the newest
    checkpoints Ray Train recorded; "" where there is neither."""
    rows = saved_rows(place) or checkpoint_rows(place)
    if not rows:
        return "", ""
    last = rows[-1]
    where = (f"epoch {last['epoch']:g}, step {last['step']:g}" if last.get("epoch") is not None
             else f"report {last.get('report', '?')}")
    if accs := [r["val_acc"] for r in rows if r.get("val_acc") is not None]:
        return where, f"val_acc {max(accs):.4g}"
    losses = [r["val_loss"] for r in rows if r.get("val_loss") is not None]
    return where, f"val_loss {min(losses):.4g}" if losses else ""


def saved_rows(place: RunPlace) -> list[dict]:
    try:
        return pq.read_table(io.BytesIO(place.read(METRICS_FILE))).to_pylist()
    except (OSError, ValueError):  # none yet (FileNotFoundError), a storage that does not answer, a torn file
        return []


def checkpoint_rows(place: RunPlace) -> list[dict]:
    try:
        snapshot = json.loads(place.read(RAY_SNAPSHOT))
    except (OSError, ValueError):
        return []
    return [r["metrics"] for r in snapshot.get("checkpoint_results", [])]


def _started(job: JobDetails) -> str:
    return datetime.fromtimestamp(job.start_time / 1000).strftime("%Y-%m-%d %H:%M:%S") if job.start_time else ""


def list_jobs(client: JobSubmissionClient) -> None:
    table = Table("run", "job", "state", "progress", "best", "started", title="orchestrator jobs")
    for job in our_jobs(client):
        where, best = progress(RunPlace.at(run_dir_of(job)))
        table.add_row(job.metadata["run"], job.submission_id, str(job.status.value), where, best, _started(job))
    Console(width=160).print(table)


def status(client: JobSubmissionClient, key: str) -> None:
    job = find_job(client, key)
    where, best = progress(RunPlace.at(run_dir_of(job)))
    print(f"{job.metadata['run']} ({job.submission_id}): {job.status.value}{f', {where}' if where else ''}"
          f"{f', best {best}' if best else ''}; folder {run_dir_of(job)}"
          f"{f'; {job.message}' if job.message and job.status != JobStatus.RUNNING else ''}")


def logs(client: JobSubmissionClient, key: str, follow: bool) -> None:
    """The job's driver output (the launch's bar, lines and summary); with `follow`, until the job ends."""
    job_id = find_job(client, key).submission_id
    if not follow:
        sys.stdout.write(client.get_job_logs(job_id))
        return

    async def stream() -> None:
        async for chunk in client.tail_job_logs(job_id):
            sys.stdout.write(chunk)
            sys.stdout.flush()

    asyncio.run(stream())


def stop(client: JobSubmissionClient, key: str, timeout_s: float = 120) -> str:
    """Stop the job (SIGINT to its driver, which ends every rank and keeps the newest checkpoint) and wait
    until Ray says it ended; the run's name."""
    job = find_job(client, key)
    client.stop_job(job.submission_id)
    wait(client, job.submission_id, timeout_s)
    return job.metadata["run"]


def wait(client: JobSubmissionClient, key: str, timeout_s: float | None = None) -> int:
    """Block until the job ends; the exit code of its driver (that of `orchestrator launch`)."""
    job_id = find_job(client, key).submission_id
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not (job := client.get_job_info(job_id)).status.is_terminal():
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} still {job.status.value} after {timeout_s:g} s")
        time.sleep(1.0)
    code = getattr(job, "driver_exit_code", None)
    return code if code is not None else EXIT_OF_STATE.get(job.status, 1)


def act(client: JobSubmissionClient, action: str, key: str | None, follow: bool) -> int:
    """One `orchestrator jobs` action; its exit code."""
    if action == "list":
        list_jobs(client)
    elif action == "status":
        status(client, key)
    elif action == "logs":
        logs(client, key, follow)
    elif action == "stop":
        run = stop(client, key)
        print(f"stopped {run}: its newest checkpoint is kept; continue with --resume {run}")
    else:
        return wait(client, key)
    return 0
