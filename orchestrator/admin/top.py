"""`orchestrator top`: nvidia-smi for the whole cluster. One Ray task pinned to each live node reads that
node's CPU use and memory (/proc) and each of its GPUs through NVML (nvidia-ml-py, NVIDIA's own binding:
utilisation, memory, power, temperature, SM clock) and which run/rank holds each GPU and runs on the node
(orchestrator.raytrain.holders); the driver prints them as one table, refreshed until Ctrl-C (`--once`: a
single table). On a node without NVIDIA's library the GPU columns say so."""

from __future__ import annotations

import socket
import time
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from rich.console import Console
from rich.live import Live
from rich.table import Table

from orchestrator.raytrain.holders import holder_of, holders

CPU_WINDOW_S = 0.5


def cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs of this node, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def memory_mib() -> tuple[float, float]:
    """(used, total) MiB of this node, from /proc/meminfo."""
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":", 1)
            info[key] = int(value.split()[0]) / 1024
    return info["MemTotal"] - info["MemAvailable"], info["MemTotal"]


def gpu_readings(known: dict[int, str]) -> list[dict[str, Any]] | str:
    """Each GPU's NVML figures and the run/rank of the processes on it, or why there are none."""
    try:
        import pynvml  # deferred: only on the node the task runs on, and absent on some

        pynvml.nvmlInit()
    except Exception as exc:  # the module or NVIDIA's library missing: a CPU node
        return f"no NVML ({type(exc).__name__})"
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            out.append({"gpu": i, "name": pynvml.nvmlDeviceGetName(handle),
                        "util_pct": pynvml.nvmlDeviceGetUtilizationRates(handle).gpu,
                        "mem_used_mib": mem.used / 2**20, "mem_total_mib": mem.total / 2**20,
                        "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000,
                        "temp_c": pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
                        "sm_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                        "held_by": sorted({holder_of(p.pid, known) or f"pid {p.pid}"
                                           for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)})})
        return out
    finally:
        pynvml.nvmlShutdown()


@ray.remote(num_cpus=0, max_retries=0)
def read_node() -> dict[str, Any]:
    before = cpu_times()
    time.sleep(CPU_WINDOW_S)
    after = cpu_times()
    used, total = memory_mib()
    known = holders(ray.get_runtime_context().get_node_id())
    return {"host": socket.gethostname(), "cpu_pct": 100 * (after[0] - before[0]) / max(after[1] - before[1], 1),
            "mem_used_mib": used, "mem_total_mib": total, "gpus": gpu_readings(known),
            "ranks": sorted(set(known.values()))}


def read_cluster() -> list[dict[str, Any]]:
    """One reading per live node, each taken on that node."""
    nodes = [n for n in ray.nodes() if n["Alive"]]
    refs = [read_node.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
            for n in nodes]
    return [{"node": n["NodeID"], "ip": n["NodeManagerAddress"], "cpus": n["Resources"].get("CPU", 0),
             **ray.get(ref, timeout=30)} for n, ref in zip(nodes, refs, strict=True)]


def table(readings: list[dict[str, Any]]) -> Table:
    out = Table("node", "ip", "CPUs", "CPU %", "memory", "GPU", "util %", "GPU memory", "power", "temp", "SM MHz",
                "run/rank", title=f"orchestrator top: {len(readings)} node(s)")
    for r in readings:
        node = [r["node"][:12], r["ip"], f"{r['cpus']:g}", f"{r['cpu_pct']:.0f}",
                f"{r['mem_used_mib'] / 1024:.1f}/{r['mem_total_mib'] / 1024:.1f} GiB"]
        if isinstance(r["gpus"], str) or not r["gpus"]:
            out.add_row(*node, r["gpus"] or "none", "", "", "", "", "", " ".join(r["ranks"]) or "-")
            continue
        for g in r["gpus"]:
            out.add_row(*node, f"{g['gpu']}: {g['name']}", f"{g['util_pct']}",
                        f"{g['mem_used_mib'] / 1024:.1f}/{g['mem_total_mib'] / 1024:.1f} GiB",
                        f"{g['power_w']:.0f} W", f"{g['temp_c']} C", f"{g['sm_mhz']}", " ".join(g["held_by"]) or "-")
            node = [""] * len(node)
    return out


def top(once: bool, every_s: float = 2.0) -> None:
    """Print the cluster's table once, or keep it refreshed until Ctrl-C."""
    if once:
        Console(width=200).print(table(read_cluster()))
        return
    with Live(table(read_cluster()), refresh_per_second=1) as live:
        while True:
            time.sleep(every_s)
            live.update(table(read_cluster()))
