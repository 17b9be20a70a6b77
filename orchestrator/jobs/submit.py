"""`orchestrator launch --detach` (and `sweep --detach`): the same launch, checked here first, run as a Ray job
on the cluster. The
job's driver is `python -m orchestrator.jobs.entry` on the head node, so closing this terminal (or losing the
SSH connection) does not end the run.

What the job gets: this folder as its working_dir (the user's own modules, scripts and data, without the run
folders, virtualenvs and git history), the orchestrator's own packages as py_modules (the version that
checked the launch is the version that runs it), and the launch as JSON: its settings and the cluster spec
with the storage path made absolute, so the run folder is the one this machine named."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

from cluster.spec import ClusterSpec
from groundwork.errors import ConfigError
from groundwork.remote import is_uri
from orchestrator.config import LaunchConfig
from orchestrator.jobs.client import META_KEY, default_address, jobs_api, jobs_client
from orchestrator.launcher.launch import prepare_run
from orchestrator.preflight import checked_plan
from orchestrator.sweeps.sweep import sweep_folder, sweep_to_submit

PAYLOAD_ENV = "ORCHESTRATOR_DETACHED"  # the launch, for orchestrator.jobs.entry
# Ray's job stop: STOP_SIGNAL to the driver, then SIGKILL after STOP_GRACE_S (Ray's default, 3 s, is too short
# to end every rank and write the run's rows). SIGINT, not Ray's SIGTERM: ray.init makes SIGTERM a bare
# sys.exit in a driver, where SIGINT ends the launch as Ctrl-C does.
STOP_SIGNAL, STOP_GRACE_S = "SIGINT", 60
NOT_SHIPPED = [".git", ".venv", "venv", "__pycache__", "*.pyc", ".mypy_cache", ".pytest_cache", ".ruff_cache"]
OWN_PACKAGES = ("groundwork", "cluster", "trainables", "orchestrator")


def detach(cfg: LaunchConfig, resume: bool) -> tuple[str, str, str]:
    """Submit the launch; (Ray's job id, the run's name, its folder). Every check of a launch runs here first."""
    spec, the_plan, address = checked_plan(cfg)
    cfg, place = prepare_run(cfg, the_plan, resume)
    address = default_address(address)  # none given: the `cluster up` one, else a one-line refusal
    payload = {"kind": "launch", "launch": cfg.saved_form(), "spec": spec_for_job(spec, the_plan.storage_path),
               "resume": resume}
    job_id = submit(address, payload, the_plan.storage_path, cfg.name or "", place.where)
    return job_id, cfg.name or "", place.where


def detach_sweep(config: str | None, resume: str | None) -> tuple[str, str, str]:
    """Submit the sweep; (Ray's job id, the sweep's name, its folder). The sweep's own checks run here first.
    Its driver works in this folder where the head sees it (a cluster on this machine, a shared home), else
    beside the runs on the cluster's storage; the sweep folder is `sweeps/<name>` there."""
    cfg = sweep_to_submit(config, resume)
    spec, the_plan, address = checked_plan(cfg.base)
    if is_uri(the_plan.storage_path):
        raise ConfigError(f"a detached sweep keeps its folder beside the runs, and storage {the_plan.storage_path}"
                          " is a URI: set storage.path to a folder the head sees, or run the sweep attached")
    cfg, folder = sweep_folder(cfg, resume)
    address = default_address(address)
    payload = {"kind": "sweep", "sweep": cfg.model_dump(mode="json"), "resume": resume is not None,
               "home": str(Path.cwd()), "spec": spec_for_job(spec, the_plan.storage_path)}
    return submit(address, payload, the_plan.storage_path, cfg.name or "", str(folder)), cfg.name or "", str(folder)


def submit(address: str, payload: dict, storage: str, name: str, folder: str) -> str:
    """Ray's job id for the payload run by orchestrator.jobs.entry on the cluster at `address`."""
    client = jobs_client(address)
    with jobs_api(address):
        return client.submit_job(
            entrypoint=f"{python_on(address)} -m orchestrator.jobs.entry",
            runtime_env=runtime_env(payload, storage),
            metadata={META_KEY: payload["kind"], "run": name, "run_dir": folder})


def spec_for_job(spec: ClusterSpec, storage_path: str) -> dict:
    """The spec as the job reads it: the storage path resolved here (a relative one would land in the job's
    temporary working_dir)."""
    data = spec.model_dump(mode="json")
    data["storage"]["path"] = storage_path
    return data


def python_on(address: str) -> str:
    """The interpreter of the job's driver: this one for a cluster on this machine (`cluster up`), else the
    head's `python` (as `ray job submit` assumes: the cluster's environment has the dependencies)."""
    host = address.rsplit(":", 1)[0]
    return shlex.quote(sys.executable) if host in ("127.0.0.1", "localhost") else "python"


def runtime_env(payload: dict, storage: str) -> dict:
    here = Path.cwd()
    excludes = list(NOT_SHIPPED)
    if not is_uri(storage) and Path(storage).is_relative_to(here):  # the run folders: checkpoints are not code
        excludes.append("/" + str(Path(storage).relative_to(here)))
    roots = {p: Path(sys.modules[p].__file__).parent for p in OWN_PACKAGES}
    return {
        "working_dir": str(here),
        "excludes": excludes,
        "py_modules": [str(path) for path in roots.values()],
        "env_vars": {PAYLOAD_ENV: json.dumps(payload), "RAY_JOB_STOP_SIGNAL": STOP_SIGNAL,
                     "RAY_JOB_STOP_WAIT_TIME_S": str(STOP_GRACE_S),
                     **({"RAY_AUTH_MODE": os.environ["RAY_AUTH_MODE"]} if "RAY_AUTH_MODE" in os.environ else {})},
    }
