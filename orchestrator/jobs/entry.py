"""The driver of a detached launch (`python -m orchestrator.jobs.entry`, run by Ray's job supervisor on the
head node): the launch this machine checked and named, run as `orchestrator launch` would run it, on the
cluster the job belongs to. Ray's job stop sends SIGTERM: it ends the run as Ctrl-C does (every rank stopped,
the rows written, the newest checkpoint kept; `--resume` continues it)."""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
from pathlib import Path

import yaml

from orchestrator.cli import main
from orchestrator.jobs.submit import PAYLOAD_ENV

SPEC_FILE = "cluster.yaml"  # in the run folder of a detached run: the spec it ran on (launch.yaml names it)


def argv_for(payload: dict, folder: Path, address: str | None) -> list[str]:
    """`orchestrator launch` arguments for the payload; the spec goes into the run's folder (a `--resume` from
    any machine that sees the folder finds it there), the settings into `folder`."""
    launch, spec = payload["launch"], payload["spec"]
    run_dir = Path(spec["storage"]["path"]) / launch["name"]
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / SPEC_FILE).write_text(yaml.safe_dump(spec, sort_keys=False))
    where = ["--cluster", str(run_dir / SPEC_FILE), *(["--address", address] if address else [])]
    if payload["resume"]:
        return ["launch", "--resume", launch["name"], *where]
    (folder / "launch.yaml").write_text(yaml.safe_dump(launch, sort_keys=False))
    return ["launch", "--config", str(folder / "launch.yaml"), *where]


def run() -> int:
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `jobs stop`: as Ctrl-C
    payload = json.loads(os.environ[PAYLOAD_ENV])
    with tempfile.TemporaryDirectory(prefix="orchestrator-job-") as tmp:
        # Ray's RAY_ADDRESS: the cluster this job runs on, as the head sees it
        return main(argv_for(payload, Path(tmp), os.environ.get("RAY_ADDRESS")))


if __name__ == "__main__":
    sys.exit(run())
