"""`orchestrator up` / `down`: a local Ray with a warm pool that outlives the launches on this machine.

A launch on a worker group of its own pays Ray's start and then Ray Train's (a controller, workers that each
import torch, the process group): ~18 s on 2 cores before its first step. `up` pays them once: one Ray node on
127.0.0.1 with token auth, as the embedded Ray is, and a pool (orchestrator.warm.pool) of the launches' shape.
A launch with no --address whose cluster spec is the one `up` started with finds it and runs there, on the pool
where its shape fits. It ends with `down`, or after --idle-timeout with no launch on it: a watcher process
(orchestrator.admin.idle) reads the launches' in-use markers, so it needs no Ray connection of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from cluster.plan import Plan
from cluster.spec import ClusterSpec
from groundwork.address import free_port
from groundwork.errors import ConfigError
from groundwork.localray import IN_USE, UP_STATE, temp_dir
from orchestrator.admin.nodes import cluster_env, down, up

DOWN, UP = "orchestrator down", "orchestrator up"


def check_one_node(spec: ClusterSpec) -> None:
    if spec.num_nodes > 1:
        raise ConfigError(f"`{UP}` starts Ray on this machine, the spec describes {spec.num_nodes} nodes: start"
                          " them with `ray start` (or `orchestrator cluster up`) and then `orchestrator pool up`")


def start(spec: ClusterSpec, the_plan: Plan, idle_timeout_s: float) -> tuple[str, str, float]:
    """Start Ray, the pool and the idle watcher; (the address, the pool's log folder, seconds it took)."""
    from orchestrator.warm.pool import pool_up  # deferred: imports Ray

    check_one_node(spec)
    started = time.perf_counter()
    port = free_port()
    address = up(spec, port, UP_STATE, down_command=DOWN)
    try:
        info, _ = pool_up(the_plan, address)
    except BaseException:
        down(UP_STATE)
        raise
    IN_USE.mkdir(parents=True, exist_ok=True)
    os.utime(IN_USE)  # the idle clock starts now
    # The watcher names the cluster's temp folder on its command line: `down` stops it with the nodes.
    subprocess.Popen([sys.executable, "-m", "orchestrator.admin.idle", str(UP_STATE), str(IN_USE),
                      str(idle_timeout_s), temp_dir(port)], env=cluster_env(), start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     cwd=os.getcwd())
    return address, info.log_dir, time.perf_counter() - started


def stop() -> str:
    """End what `up` started; its address."""
    return down(UP_STATE, up_command=UP)
