"""An unmodified torchrun script (`--script train.py -- ARGS`, `--module pkg.mod`) on a Ray Train worker group.

Each Ray Train worker is one slot: Ray placed it (resources, placement group, node group) and gave it its
CUDA_VISIBLE_DEVICES; it starts the script as a child process with torchrun's environment contract, so the
script's own `dist.init_process_group()` (env://) forms the job's process group, across nodes too. The
workers' own process group (gloo) only lets rank 0 hand every rank the script's MASTER_ADDR/MASTER_PORT and
the restart count.

The child dies with its worker (PR_SET_PDEATHSIG): when one rank's script exits non-zero, its worker raises,
Ray Train ends the group, and every other rank's script goes with its worker, on every node. Its output goes
to logs/rank-N.log (and, for rank 0 or with --tee, to the terminal); a new output line or more CPU time is
progress for the hang watchdog, as is each `orchestrator.report(metrics)` of the script, whose rank-0 reports
become the run's rows (they come down a pipe named in the script's environment, see reports).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import IO, Any

import ray
import ray.train
import torch.distributed as dist

from groundwork.address import free_port
from groundwork.errors import NonFiniteLoss, ScriptExited
from orchestrator.raytrain.job import Job
from orchestrator.raytrain.reports import REPORT_FD, ReportRows
from orchestrator.raytrain.watchdog import Heartbeat
from trainables.context import DistContext

PR_SET_PDEATHSIG = 1
CPU_POLL_S = 1.0


def die_with_parent() -> None:
    """In the child, before exec: the kernel sends it SIGKILL when its parent (the Ray worker) dies."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def rendezvous(ctx: DistContext, sink: Any) -> tuple[str, int, int]:
    """(MASTER_ADDR, MASTER_PORT, restart count), chosen by rank 0 and handed to every rank over the
    workers' own process group."""
    box: list[Any] = [None]
    if ctx.is_main:
        restarts = ray.get(sink.started.remote()) if sink is not None else 0
        box = [(ray.util.get_node_ip_address(), free_port(), restarts)]
    if ctx.distributed:
        dist.broadcast_object_list(box, src=0)
    return box[0]


CONTRACT = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
            "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID", "OMP_NUM_THREADS",
            "CUDA_VISIBLE_DEVICES")


def given(env: dict[str, str]) -> str:
    """The part of a script's environment this launch decides (torchrun's contract, the spec's NCCL/gloo
    variables, CUDA_VISIBLE_DEVICES), as one line for the rank's log."""
    keys = [k for k in env if k in CONTRACT or k.startswith(("NCCL_", "GLOO_"))]
    return " ".join(f"{k}={env[k]}" for k in sorted(keys))


def torchrun_env(job: Job, ctx: DistContext, master: tuple[str, int, int]) -> dict[str, str]:
    """torchrun's environment contract for this slot, on top of this worker's own (the spec's NCCL/gloo
    variables, OMP_NUM_THREADS and CUDA_VISIBLE_DEVICES as Ray set them)."""
    train = ray.train.get_context()
    addr, port, restarts = master
    return {
        **os.environ,
        "RANK": str(ctx.rank), "WORLD_SIZE": str(ctx.world_size),
        "LOCAL_RANK": str(train.get_local_rank()), "LOCAL_WORLD_SIZE": str(train.get_local_world_size()),
        "GROUP_RANK": str(train.get_node_rank()), "ROLE_RANK": str(ctx.rank),
        "ROLE_WORLD_SIZE": str(ctx.world_size), "ROLE_NAME": "default",
        "MASTER_ADDR": addr, "MASTER_PORT": str(port),
        "TORCHELASTIC_RESTART_COUNT": str(restarts), "TORCHELASTIC_RUN_ID": job.name,
        "TORCHELASTIC_MAX_RESTARTS": str(job.max_restarts),
        "PYTHONUNBUFFERED": "1",  # lines reach the log as they are printed
    }


class Output:
    """Copies the child's stdout and stderr, line by line, into the rank's log (and the terminal); keeps the
    last stderr lines for the failure message and counts lines as progress."""

    def __init__(self, log_file: IO[str], echo: str | None) -> None:
        self.log_file, self.echo = log_file, echo
        self.lines = 0
        self.last_err: deque[str] = deque(maxlen=5)
        self.lock = threading.Lock()

    def pump(self, stream: IO[str], is_err: bool) -> threading.Thread:
        def run() -> None:
            for line in stream:
                with self.lock:
                    self.log_file.write(line)
                    self.lines += 1
                    if is_err and line.strip():
                        self.last_err.append(line.rstrip())
                if self.echo is not None:
                    print(f"{self.echo}{line}", end="", file=sys.stderr if is_err else sys.stdout, flush=True)
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread


class ReportPipe:
    """Reads the script's `orchestrator.report` lines: each moves this rank's heartbeat, rank 0's become rows
    at the driver's sink; a nan/inf loss is kept in `error` for run_script to end the script with."""

    def __init__(self, ctx: DistContext, sink: Any, beat: Heartbeat | None) -> None:
        self.ctx, self.sink, self.beat = ctx, sink, beat
        self.rows = ReportRows()
        self.error: NonFiniteLoss | None = None
        self.read_fd, self.write_fd = os.pipe()

    def start(self) -> threading.Thread:
        os.close(self.write_fd)  # the child holds its own copy; EOF comes when it exits
        thread = threading.Thread(target=self.read, daemon=True)
        thread.start()
        return thread

    def read(self) -> None:
        with os.fdopen(self.read_fd) as stream:
            for line in stream:
                try:
                    row = self.rows.row(json.loads(line))
                except NonFiniteLoss as exc:
                    self.error = exc
                    continue
                if self.beat is not None:
                    self.beat.tick_step(int(row["step"]))
                if self.ctx.is_main and self.sink is not None:
                    self.sink.push.remote(row)


class ExitWatch:
    """Waits for the child in a thread of its own, so its exit time is the kernel's (to the millisecond): when
    one rank fails, the others fail after it (their peers are gone), and the earliest exit names the cause."""

    def __init__(self, child: subprocess.Popen) -> None:
        self.child, self.at = child, 0.0
        self.exited = threading.Event()
        threading.Thread(target=self.wait, daemon=True).start()

    def wait(self) -> None:
        self.child.wait()
        self.at = time.time()
        self.exited.set()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its children that exited, from /proc (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def watch(exit_watch: ExitWatch, output: Output, reports: ReportPipe, beat: Heartbeat | None) -> None:
    """Until the script exits: a new output line or more CPU time is progress (the heartbeat moves); a nan
    loss reported ends it (killed, the error raised)."""
    seen = (0, 0.0)
    while not exit_watch.exited.wait(CPU_POLL_S) and reports.error is None:
        now = (output.lines, cpu_seconds(exit_watch.child.pid))
        if beat is not None and now != seen:
            beat.tick_step(beat.step)
        seen = now
    if reports.error is not None:
        exit_watch.child.kill()
        exit_watch.exited.wait()
        raise reports.error


def run_script(job: Job, ctx: DistContext, sink: Any, beat: Heartbeat | None) -> None:
    """Start the script on this slot, wait for it, and raise ScriptExited if it fails."""
    master = rendezvous(ctx, sink)
    command = [sys.executable, *job.command]
    echo = f"[rank {ctx.rank}] " if ctx.is_main or job.tee else None
    log_path = Path(job.log_dir or ".") / f"rank-{ctx.rank}.log"
    reports = ReportPipe(ctx, sink, beat)
    env = {**torchrun_env(job, ctx, master), REPORT_FD: str(reports.write_fd)}
    with open(log_path, "a", buffering=1) as log_file:
        log_file.write(f"starting {' '.join(command)} with {given(env)}\n")
        child = subprocess.Popen(command, env=env, cwd=job.cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, bufsize=1, preexec_fn=die_with_parent, pass_fds=(reports.write_fd,))
        output = Output(log_file, echo)
        readers = [output.pump(child.stdout, False), output.pump(child.stderr, True), reports.start()]
        exit_watch = ExitWatch(child)
        watch(exit_watch, output, reports, beat)
        for reader in readers:
            reader.join(timeout=5)
    if reports.error is not None:  # reported just before the script ended
        raise reports.error
    if child.returncode != 0:
        raise ScriptExited(ctx.rank, child.returncode, output.last_err[-1] if output.last_err else "",
                           exit_watch.at)
