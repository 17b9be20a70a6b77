"""Startup: from the command to the first optimizer step, `orchestrator launch` (embedded Ray, Ray Train
workers) vs torchrun running the same 2-worker job of the shared loop, alternated in one run, with the
torchrun entry itself run by `orchestrator launch --script` beside them, and the same
launch joining a local Ray started beforehand (`orchestrator cluster up`, not timed: "reuse a running Ray"),
then joining it with a warm pool up (`orchestrator pool up`, not timed: the workers a launch runs on), and
last with no --address on `orchestrator up` (a local Ray with a pool, started beforehand, not timed).
Each run's rank-0 log stamps its phases, so the table says where the time goes. Goals: a launch
on a group of its own <= 2.0 x torchrun, on `orchestrator up` <= 0.7 x.

    .venv/bin/python bench/startup.py --repeats 3 --out bench/results/startup_cpu.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from common import log_stamp, provenance, write_result

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
SCRIPT = Path(sys.executable).parent / "orchestrator"
# The installed entry point, as a user runs it; `python -m orchestrator` where the project is only on
# PYTHONPATH (the lent GPU machine).
CLI = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "orchestrator"]
JOB = {"model": "digits-cnn", "max_steps": 1, "epochs": 1}
# rank-0 log line -> phase name (the first line holding the text stamps the phase)
PHASES = {"rank 0 of": "worker started", "parameters on": "data + model built",
          "first optimizer step done": "first step done"}


def stamps(log: Path) -> dict[str, float]:
    """Epoch seconds at which rank 0 logged each phase."""
    out: dict[str, float] = {}
    for line in log.read_text().splitlines():
        for text, phase in PHASES.items():
            if text in line and phase not in out:
                out[phase] = log_stamp(line)
    return out


def timed(command: list[str], cwd: Path, log: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    started = time.time()
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    ended = time.time()
    if proc.returncode != 0:
        raise SystemExit(f"{command[0]} failed: {proc.stderr[-2000:]}")
    phases = {name: at - started for name, at in stamps(log).items()}
    return {**phases, "exit": ended - started}


def torchrun(tmp: Path, port: int) -> dict[str, float]:
    out = tmp / "torchrun"
    shutil.rmtree(out, ignore_errors=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(port),
               str(BENCH / "torchrun_entry.py"), json.dumps(JOB), str(out)]
    return timed(command, tmp, out / "logs" / "rank-0.log")


def script(tmp: Path, name: str) -> dict[str, float]:
    """The torchrun entry itself, unmodified, as `orchestrator launch --script` runs it on Ray's workers."""
    out = tmp / f"script-{name}"
    command = [*CLI, "launch", "--workers", "2", "--quiet", "--name", name, "--script",
               str(BENCH / "torchrun_entry.py"), "--", json.dumps(JOB), str(out)]
    return timed(command, tmp, out / "logs" / "rank-0.log")


def orchestrator(tmp: Path, name: str, address: str | None = None) -> dict[str, float]:
    join = ["--address", address] if address else []
    command = [*CLI, "launch", "--workers", "2", "--quiet", "--name", name, *join,
               *[f"--{k.replace('_', '-')}={v}" for k, v in JOB.items()]]
    return timed(command, tmp, tmp / "runs" / name / "logs" / "rank-0.log")


@contextlib.contextmanager
def running_local_ray(port: int) -> Iterator[str]:
    spec = str(REPO / "cluster" / "examples" / "local.yaml")
    subprocess.run([*CLI, "cluster", "up", spec, "--port", str(port)], check=True, capture_output=True)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([*CLI, "cluster", "down"], check=True, capture_output=True)


@contextlib.contextmanager
def standing_ray(cwd: Path) -> Iterator[None]:
    """`orchestrator up`: what a launch with no --address finds and runs on."""
    subprocess.run([*CLI, "up", "--workers", "2"], check=True, capture_output=True, cwd=cwd)
    try:
        yield
    finally:
        subprocess.run([*CLI, "down"], check=True, capture_output=True)


@contextlib.contextmanager
def warm_pool(address: str, cwd: Path) -> Iterator[None]:
    subprocess.run([*CLI, "pool", "up", "--address", address, "--workers", "2"], check=True, capture_output=True,
                   cwd=cwd)
    try:
        yield
    finally:
        subprocess.run([*CLI, "pool", "down", "--address", address], check=True, capture_output=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one repeat")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    runs: dict[str, list[dict[str, float]]] = {"torchrun": [], "orchestrator": [], "orchestrator --script": [],
                                               "orchestrator --address": [], "orchestrator, warm pool": [],
                                               "orchestrator up": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):  # alternated, so both see the same machine load
            runs["torchrun"].append(torchrun(Path(tmp), 29500 + i))
            runs["orchestrator"].append(orchestrator(Path(tmp), f"startup-{i}"))
            runs["orchestrator --script"].append(script(Path(tmp), f"script-{i}"))
        with running_local_ray(6419) as address:  # the Ray a user keeps running between launches
            for i in range(repeats):
                runs["orchestrator --address"].append(orchestrator(Path(tmp), f"joined-{i}", address))
            with warm_pool(address, Path(tmp)):
                for i in range(repeats):
                    runs["orchestrator, warm pool"].append(orchestrator(Path(tmp), f"pooled-{i}", address))
        with standing_ray(Path(tmp)):
            for i in range(repeats):
                runs["orchestrator up"].append(orchestrator(Path(tmp), f"up-{i}"))
    median = {tool: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for tool, rs in runs.items()}
    first = {tool: m["first step done"] for tool, m in median.items()}
    ratios = {tool: round(first[tool] / first["torchrun"], 3) for tool in runs if tool != "torchrun"}
    print(f"{'seconds from the command (median of ' + str(repeats) + ')':<40}" + "".join(f"{t:>26}" for t in runs))
    for phase in [*PHASES.values(), "exit"]:
        print(f"{phase:<40}" + "".join(f"{median[t][phase]:>26.1f}" for t in runs))
    print("first step, x torchrun (goals: own group <= 2.0, orchestrator up <= 0.7): "
          + ", ".join(f"{t} {r:.2f}" for t, r in ratios.items()))
    write_result({"job": JOB, "workers": 2, "repeats": repeats, "median_s": median, "runs": runs,
                  "first_step_ratio": ratios["orchestrator"],
                  "pool_first_step_ratio": ratios["orchestrator, warm pool"],
                  "up_first_step_ratio": ratios["orchestrator up"],
                  "script_first_step_ratio": ratios["orchestrator --script"],
                  "first_step_ratio_vs_torchrun": ratios, "cpus": os.cpu_count(), **provenance()}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
