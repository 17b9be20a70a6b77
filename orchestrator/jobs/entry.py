"""The driver of a detached launch (`python -m orchestrator.jobs.entry`, run by Ray's job supervisor on the
head node): the launch this machine checked and named, run as `orchestrator launch` would run it, on the
cluster the job belongs to. `orchestrator jobs stop` has Ray send SIGINT (see submit.STOP_SIGNAL): it ends the
run as Ctrl-C does (every rank stopped, the rows written, the newest checkpoint kept; `--resume` continues it)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import yaml

from groundwork.remote import RunPlace, join, open_uri, upload_file
from orchestrator.jobs.submit import PAYLOAD_ENV

SPEC_FILE = "cluster.yaml"  # in the run folder of a detached run: the spec it ran on (launch.yaml names it)
SUBMITTED_FILE = "submitted.yaml"  # beside it: the settings as submitted (launch.yaml, once written, resolved)


def argv_for(payload: dict, address: str | None) -> list[str]:
    """`orchestrator launch` arguments for the payload. The spec and settings go into the run's folder: a
    `--resume` from any machine that sees the folder finds them there."""
    launch, spec = payload["launch"], payload["spec"]
    place = RunPlace.of(spec["storage"]["path"], launch["name"])
    # On a URI they are copied there; the launch works in a staging copy of the run that it starts afresh.
    folder = place.local if place.uri is None else place.local.with_name(f".detached-{launch['name']}")
    files = {SPEC_FILE: spec} if payload["resume"] else {SPEC_FILE: spec, SUBMITTED_FILE: launch}
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_text(yaml.safe_dump(data, sort_keys=False))
        if place.uri is not None:
            fs, path = open_uri(join(place.uri, name))
            upload_file(folder / name, fs, path)
    where = ["--cluster", str(folder / SPEC_FILE), *(["--address", address] if address else [])]
    if payload["resume"]:
        return ["launch", "--resume", launch["name"], *where]
    return ["launch", "--config", str(folder / SUBMITTED_FILE), *where]


def sweep_argv(payload: dict, address: str | None) -> list[str]:
    """`orchestrator sweep` arguments for the payload, run from the folder it was submitted in where this
    node sees it (else beside the runs); the spec goes beside the runs, where a later --resume finds it."""
    sweep, spec = payload["sweep"], payload["spec"]
    storage = Path(spec["storage"]["path"])
    home = Path(payload["home"]) if Path(payload["home"]).is_dir() else storage.parent
    os.chdir(home)
    if payload["resume"]:
        return ["sweep", "--resume", sweep["name"], "--quiet"]
    storage.mkdir(parents=True, exist_ok=True)
    spec_file = storage / f".sweep-{sweep['name']}-{SPEC_FILE}"
    spec_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    sweep["base"] = {**sweep["base"], "cluster": str(spec_file), "address": address}
    submitted = storage / f".sweep-{sweep['name']}-{SUBMITTED_FILE}"
    submitted.write_text(yaml.safe_dump(sweep, sort_keys=False))
    return ["sweep", "--config", str(submitted), "--quiet"]


def run() -> None:
    payload = json.loads(os.environ[PAYLOAD_ENV])
    # Ray's RAY_ADDRESS: the cluster this job runs on, as the head sees it. The process becomes the CLI's
    # own launch (or sweep): its exit code is the job's, its signals (Ray's stop) reach it unchanged.
    address = os.environ.get("RAY_ADDRESS")
    argv = sweep_argv(payload, address) if payload.get("kind") == "sweep" else argv_for(payload, address)
    os.execv(sys.executable, [sys.executable, "-m", "orchestrator", *argv])


if __name__ == "__main__":
    run()
