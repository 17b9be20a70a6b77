"""A hung run explained: before the watchdog ends it, every rank's Python stack is dumped by py-spy (the tool
Ray's own `ray stack` uses), run on the rank's own node as a Ray task, so it works across nodes. py-spy reads
the process from outside: a rank stuck in a collective (its GIL released in C++) or frozen is read all the
same. The dump includes the rank's child processes (`--subprocesses`): a torchrun script's own stack."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

DUMP_TIMEOUT_S = 20
FRAME = re.compile(r"^\s+(\S+) \((.+)\)$")  # py-spy: "    all_reduce (torch/distributed/distributed_c10d.py:2850)"


def py_spy() -> str | None:
    """py-spy beside this Python (a venv's bin/, where Ray workers have no PATH to it), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


@ray.remote(num_cpus=0, max_retries=0)
def dump_one(pid: int) -> str:
    tool = py_spy()
    if tool is None:
        return "py-spy is not installed on this node: pip install py-spy"
    try:
        proc = subprocess.run([tool, "dump", "--subprocesses", "--pid", str(pid)], capture_output=True, text=True,
                              timeout=DUMP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"py-spy dump of pid {pid} took over {DUMP_TIMEOUT_S} s"
    return proc.stdout if proc.returncode == 0 else f"py-spy dump of pid {pid} failed: {proc.stderr.strip()[-500:]}"


def dump_stacks(ranks: dict[int, tuple[int, str]]) -> dict[int, str]:
    """rank -> py-spy's dump of that rank's process (and its children), each read on its own node."""
    refs = {rank: dump_one.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(pid)
            for rank, (pid, node) in ranks.items()}
    out = {}
    for rank, ref in refs.items():
        try:
            out[rank] = ray.get(ref, timeout=DUMP_TIMEOUT_S + 10)
        except Exception as exc:  # a node gone, a task that could not run: the others still count
            out[rank] = f"no stack: {type(exc).__name__}: {exc}"
    return out


def threads(process: str) -> list[list[tuple[str, str]]]:
    """Each thread's frames, innermost first, as (function, file:line), from one process of a py-spy dump."""
    out = []
    for thread in re.split(r"^Thread ", process, flags=re.M)[1:]:
        frames = [(m[1], m[2]) for m in (FRAME.match(line) for line in thread.splitlines()[1:]) if m]
        if frames:
            out.append(frames)
    return out


def innermost(dump: str) -> str | None:
    """Where a rank's training is stuck, from its py-spy dump, as "function (file:line)": the top frame of
    the thread that runs the worker's entry; for a torchrun script (the worker only waits for it), the top
    frame of the script's process, dumped after the worker's."""
    processes = re.split(r"^Process \d+:", dump, flags=re.M)[1:]
    if not processes:
        return None
    training = next((t for t in threads(processes[0]) if any(f == "train_worker" for f, _ in t)), None)
    if training is None:
        return None
    if any(f == "run_script" for f, _ in training) and len(processes) > 1:
        script = threads(processes[1])
        training = script[0] if script else training
    function, where = training[0]
    return f"{function} ({where})"
