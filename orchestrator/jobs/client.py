"""Ray's Jobs API for a cluster named by its GCS address (what --address takes): its dashboard's URL is read
from the cluster itself, and the client presents this machine's token (see orchestrator.raytrain.auth)."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator

from ray._private import ray_constants
from ray._raylet import GcsClient
from ray.job_submission import JobDetails, JobSubmissionClient

from groundwork.address import wait_reachable
from groundwork.errors import ConfigError, OrchestratorError, RunFailed
from groundwork.localray import CLUSTER_STATE

QUIET_LOGGERS = ("ray.dashboard.modules.dashboard_sdk", "ray._private.runtime_env.packaging",
                 "ray.dashboard.modules.job.sdk")
META_KEY = "orchestrator"  # in a job's metadata: which of Ray's jobs are ours ("launch"), and their run


def default_address(address: str | None) -> str:
    """The address given (--address, or the cluster spec's), else the cluster `orchestrator cluster up` started
    here."""
    found = address or (json.loads(CLUSTER_STATE.read_text())["address"] if CLUSTER_STATE.exists() else None)
    if found is None:
        raise ConfigError("no Ray cluster named: pass --address HOST:PORT or a --cluster spec with an address"
                          " (or start one on this machine with `orchestrator cluster up SPEC`)")
    return found


def dashboard_url(address: str) -> str:
    """The Jobs API's URL of the cluster at `address` (host:port of its GCS), as its head registered it."""
    wait_reachable(address)
    url = GcsClient(address=address).internal_kv_get(ray_constants.DASHBOARD_ADDRESS.encode(),
                                                     ray_constants.KV_NAMESPACE_DASHBOARD, timeout=10)
    if not url:
        raise ConfigError(f"the Ray cluster at {address} runs no dashboard, which serves Ray's Jobs API: start its"
                          " head with --include-dashboard=true (`orchestrator cluster up` does)")
    return "http://" + url.decode()


def jobs_client(address: str) -> JobSubmissionClient:
    with jobs_api(address):
        return JobSubmissionClient(dashboard_url(address))


@contextlib.contextmanager
def jobs_api(address: str) -> Iterator[None]:
    """Calls to the Jobs API of the cluster at `address`: its failures (an HTTP error status, a dashboard that
    went away) as one line, and Ray's INFO lines (packages uploaded, log streams closed) off the terminal."""
    quiet = [logging.getLogger(n) for n in QUIET_LOGGERS]
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.WARNING)
    try:
        yield
    except OrchestratorError:
        raise
    except (RuntimeError, ConnectionError, OSError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise RunFailed(f"Ray's Jobs API of the cluster at {address}: {first}") from exc
    finally:
        for q, level in zip(quiet, levels, strict=True):
            q.setLevel(level)


def our_jobs(client: JobSubmissionClient) -> list[JobDetails]:
    """This cluster's orchestrator jobs, oldest first."""
    jobs = [j for j in client.list_jobs() if (j.metadata or {}).get(META_KEY)]
    return sorted(jobs, key=lambda j: j.start_time or 0)


def find_job(client: JobSubmissionClient, key: str) -> JobDetails:
    """The job whose submission id is `key`, else the newest job of run `key`."""
    jobs = our_jobs(client)
    found = [j for j in jobs if j.submission_id == key] or [j for j in jobs if j.metadata.get("run") == key]
    if not found:
        known = ", ".join(j.metadata["run"] for j in jobs[-5:]) or "none"
        raise ConfigError(f"no orchestrator job or run named {key!r} on this cluster (newest runs: {known}):"
                          " see `orchestrator jobs list`")
    return found[-1]


def run_dir_of(job: JobDetails) -> str:
    """The run folder of a detached run: a path, or a URI (see groundwork.remote)."""
    return job.metadata["run_dir"]
