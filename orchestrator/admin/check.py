"""`orchestrator cluster check SPEC`: is the live cluster what the spec says?

Compares node count, CPUs, GPUs and GPU type per node group with `ray.nodes()`; runs a probe on every node
for the declared network interfaces (/sys/class/net) and InfiniBand HCAs (/sys/class/infiniband, port state);
then times an all-reduce across all nodes (gloo on CPU, NCCL on GPU) and reports bus bandwidth per message
size. Any difference is a row marked FAIL and a non-zero exit.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from cluster.plan import JobRequest, collective_env, group_resource
from cluster.spec import ClusterSpec, NodeGroup
from groundwork.address import free_port

SIZES = (2**10, 2**16, 2**20, 2**24)  # bytes: 1 KiB .. 16 MiB


@dataclass(frozen=True)
class Finding:
    what: str
    expected: str
    found: str
    ok: bool


def group_of(node: dict, spec: ClusterSpec) -> NodeGroup | None:
    """The spec group a live node belongs to, by the node_group_<name> resource `up`/`render` give it."""
    return next((g for g in spec.node_groups if group_resource(g.name) in node["Resources"]), None)


@ray.remote(num_cpus=0)
def probe_node(interfaces: list[str], hcas: list[str]) -> dict[str, str]:
    """Runs on one node: which declared interfaces and HCAs exist there, and each HCA port's state."""
    found: dict[str, str] = {}
    for name in interfaces:
        found[f"net {name}"] = "present" if Path(f"/sys/class/net/{name}").exists() else "missing"
    for hca in hcas:
        ports = sorted(Path(f"/sys/class/infiniband/{hca}/ports").glob("*/state"))
        found[f"hca {hca}"] = ", ".join(p.read_text().strip() for p in ports) if ports else "missing"
    return found


def compare_nodes(spec: ClusterSpec, nodes: list[dict]) -> list[Finding]:
    out = [Finding("nodes", str(spec.num_nodes), str(len(nodes)), len(nodes) == spec.num_nodes)]
    for g in spec.node_groups:
        members = [n for n in nodes if group_of(n, spec) is g]
        out.append(Finding(f"group {g.name}: nodes", str(g.count), str(len(members)), len(members) == g.count))
        for n in members:
            res, node = n["Resources"], n["NodeID"][:8]
            cpus, gpus = int(res.get("CPU", 0)), int(res.get("GPU", 0))
            out.append(Finding(f"{g.name} {node}: CPUs", str(g.cpus), str(cpus), cpus == g.cpus))
            out.append(Finding(f"{g.name} {node}: GPUs", str(g.gpus.count), str(gpus), gpus == g.gpus.count))
            if g.gpus.type:
                types = [k.split(":", 1)[1] for k in res if k.startswith("accelerator_type:")]
                ok = any(g.gpus.type.upper() in t.upper() for t in types)
                out.append(Finding(f"{g.name} {node}: GPU type", g.gpus.type, ", ".join(types) or "none", ok))
    return out


def probe_network(spec: ClusterSpec, nodes: list[dict]) -> list[Finding]:
    out = []
    for n in nodes:
        g = group_of(n, spec)
        if g is None or not (g.network.interfaces or g.network.infiniband):
            continue
        strategy = NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        found = ray.get(probe_node.options(scheduling_strategy=strategy).remote(
            g.network.interfaces, g.network.infiniband))
        for what, state in found.items():
            ok = state == "present" or ("ACTIVE" in state)
            out.append(Finding(f"{g.name} {n['NodeID'][:8]}: {what}", "present" if what.startswith("net")
                               else "ACTIVE", state, ok))
    return out


@ray.remote(num_cpus=0)
class Ranker:
    """One process per node for the all-reduce."""

    def address(self) -> str:
        return ray.util.get_node_ip_address()

    def run(self, rank: int, world: int, master: str, port: int, backend: str, env: dict[str, str],
            sizes: list[int], repeats: int) -> list[float]:
        import torch  # deferred: only the probe actors on the nodes need torch, not the CLI
        import torch.distributed as dist  # deferred: as torch

        os.environ.update(env)
        dist.init_process_group(backend, init_method=f"tcp://{master}:{port}", rank=rank, world_size=world)
        device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
        seconds = []
        for size in sizes:
            t = torch.ones(size // 4, dtype=torch.float32, device=device)
            dist.all_reduce(t)  # warm-up: connections, buffers
            if backend == "nccl":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(repeats):
                dist.all_reduce(t)
            if backend == "nccl":
                torch.cuda.synchronize()
            seconds.append((time.perf_counter() - start) / repeats)
            assert t[0].item() == world ** (repeats + 1), "all-reduce gave a wrong sum"
        dist.destroy_process_group()
        return seconds


def allreduce_bandwidth(spec: ClusterSpec, nodes: list[dict], repeats: int = 5) -> list[tuple[int, float, float]]:
    """(bytes, seconds, bus GB/s) per size, one rank per node, ranks pinned by node affinity."""
    use_gpu = all(n["Resources"].get("GPU", 0) >= 1 for n in nodes)
    backend = "nccl" if use_gpu else "gloo"
    env = collective_env(list(spec.node_groups), JobRequest(gpus_per_worker=int(use_gpu)), 1)
    rankers = [Ranker.options(num_gpus=1 if use_gpu else 0,
                              scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
               for n in nodes]
    master = ray.get(rankers[0].address.remote())
    port = free_port()
    times = ray.get([r.run.remote(i, len(rankers), master, port, backend, env, list(SIZES), repeats)
                     for i, r in enumerate(rankers)])
    world = len(rankers)
    out = []
    for j, size in enumerate(SIZES):
        seconds = max(t[j] for t in times)
        bus = size * 2 * (world - 1) / world / seconds / 1e9  # nccl-tests' bus bandwidth
        out.append((size, seconds, bus))
    for r in rankers:
        ray.kill(r)
    return out


def check(spec: ClusterSpec) -> tuple[list[Finding], list[tuple[int, float, float]]]:
    nodes = [n for n in ray.nodes() if n["Alive"]]
    findings = compare_nodes(spec, nodes) + probe_network(spec, nodes)
    # gloo/NCCL abort the process on an interface that does not exist: only measure on a sound network
    sound = all(f.ok for f in findings)
    bandwidth = allreduce_bandwidth(spec, nodes) if len(nodes) > 1 and sound else []
    return findings, bandwidth
