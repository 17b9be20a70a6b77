"""From a hardware spec and a job request to a plan: how many workers, what each gets, where they go, and the
environment their collectives need. Pure: no Ray, so every decision is tested without starting a cluster."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cluster.spec import ClusterSpec, NodeGroup
from groundwork.errors import ConfigError

Placement = Literal["pack", "spread", "strict-pack", "strict-spread"]
RAY_STRATEGY: dict[str, str] = {
    "pack": "PACK", "spread": "SPREAD", "strict-pack": "STRICT_PACK", "strict-spread": "STRICT_SPREAD",
}


def group_resource(group: str) -> str:
    """The custom Ray resource every node of a group carries, so a job can be pinned to that group."""
    return f"node_group_{group}"


@dataclass(frozen=True)
class JobRequest:
    """What a job asks of the cluster. Built from a launch config that is already validated (its fields and
    their cross-field rules live on orchestrator.config.LaunchConfig), so nothing is checked again here: the
    plan only checks the request against the spec."""

    workers: int = 1
    gpus_per_worker: float = 0  # a whole number, or a fraction < 1 for one worker sharing a GPU (sweep trials)
    cpus_per_worker: int | None = None  # None: share each node's CPUs among the workers placed on it
    placement: Placement = "pack"
    node_group: str | None = None
    nccl_debug: str | None = None  # e.g. INFO, WARN
    hsdp: bool = False  # sharded within shard groups, replicated across them: the plan sets the mesh
    shard_size: int | None = None  # hsdp's shard group; None: the workers that fit one node


@dataclass(frozen=True)
class Plan:
    workers: int
    cpus_per_worker: int
    gpus_per_worker: float
    placement_strategy: str  # Ray's name: PACK, SPREAD, STRICT_PACK, STRICT_SPREAD
    backend: Literal["gloo", "nccl"]
    env: dict[str, str]
    storage_path: str
    groups: tuple[str, ...]  # node groups the workers may land on
    custom_resources: dict[str, float] = field(default_factory=dict)
    gpu_type: str | None = None  # the spec's gpus.type where every group the workers may use names the same
    mesh: tuple[int, int] | None = None  # hsdp: (replicas, workers per shard group)
    mesh_link: str = ""  # hsdp: what joins a shard group ("one node", "one NVLink domain of 4 GPUs", ...)

    @property
    def use_gpu(self) -> bool:
        return self.gpus_per_worker > 0

    @property
    def resources_per_worker(self) -> dict[str, float]:
        res: dict[str, float] = {"CPU": self.cpus_per_worker, **self.custom_resources}
        if self.use_gpu:
            res["GPU"] = self.gpus_per_worker
        return res

    def describe(self) -> list[tuple[str, str]]:
        return [
            ("workers", str(self.workers)),
            ("resources per worker", ", ".join(f"{k}={v:g}" for k, v in self.resources_per_worker.items())),
            ("placement", self.placement_strategy),
            ("backend", self.backend),
            ("node groups", ", ".join(self.groups)),
            ("storage", self.storage_path),
            *([("mesh (hsdp)", f"{self.mesh[0]} replica(s) x {self.mesh[1]} shard(s): parameters gathered within"
                 f" a group of {self.mesh[1]} worker(s) {self.mesh_link}, gradients all-reduced across the groups")]
              if self.mesh else []),
            *((f"env {k}", v) for k, v in sorted(self.env.items())),
        ]


def _eligible_groups(spec: ClusterSpec, job: JobRequest) -> list[NodeGroup]:
    if job.node_group is not None:
        try:
            groups = [spec.group(job.node_group)]
        except ValueError as exc:
            raise ConfigError(f"node_group: {exc}") from None
    else:
        groups = list(spec.node_groups)
    if job.gpus_per_worker:
        with_gpus = [g for g in groups if g.gpus.count >= job.gpus_per_worker]
        if not with_gpus:
            have = ", ".join(f"{g.name}: {g.gpus.count}" for g in groups)
            raise ConfigError(
                f"gpus_per_worker={job.gpus_per_worker:g} but no node has that many GPUs ({have}):"
                " lower --gpus-per-worker or describe the GPUs in the cluster spec"
            )
        groups = with_gpus
    return groups


def _cpus_per_worker(groups: list[NodeGroup], job: JobRequest) -> int:
    if job.cpus_per_worker is not None:
        return job.cpus_per_worker
    if job.gpus_per_worker:
        # A GPU node's CPUs are split among the workers its GPUs can hold (dataloader workers need them).
        return max(1, min(g.cpus // _fit(g.gpus.count, job.gpus_per_worker) for g in groups))
    total = sum(g.count * g.cpus for g in groups)
    return max(1, min(total // job.workers, min(g.cpus for g in groups)))


def _fit(have: float, each: float) -> int:
    """How many `each` fit in `have` (GPU fractions included: 0.5 fits twice in 1)."""
    return math.floor(have / each + 1e-9)


def _workers_per_node(group: NodeGroup, cpus: int, gpus: float) -> int:
    fit = group.cpus // cpus
    return min(fit, _fit(group.gpus.count, gpus)) if gpus else fit


def _check_capacity(groups: list[NodeGroup], job: JobRequest, cpus: int) -> None:
    per_node = {g.name: _workers_per_node(g, cpus, job.gpus_per_worker) for g in groups}
    capacity = sum(g.count * per_node[g.name] for g in groups)
    ask = f"workers({job.workers}) x [cpus({cpus}), gpus({job.gpus_per_worker:g})]"
    have = ", ".join(f"{g.name}: {g.count} node(s) x {per_node[g.name]} worker(s)" for g in groups)
    if capacity < job.workers:
        raise ConfigError(f"{ask} does not fit the cluster ({have}): ask for fewer workers or smaller ones")
    if job.placement == "strict-pack" and max(per_node.values()) < job.workers:
        raise ConfigError(f"placement strict-pack needs all {ask} on one node, but at most"
                          f" {max(per_node.values())} fit on a node: use placement pack or spread")
    nodes = sum(g.count for g in groups if per_node[g.name] > 0)
    if job.placement == "strict-spread" and nodes < job.workers:
        raise ConfigError(f"placement strict-spread needs one node per worker: workers({job.workers}) >"
                          f" nodes that fit a worker({nodes}): use placement spread or fewer workers")


def collective_env(groups: list[NodeGroup], job: JobRequest, cpus: int) -> dict[str, str]:
    """Environment for gloo/NCCL and the intra-op thread pools, from what the spec says the nodes have."""
    env = {"OMP_NUM_THREADS": str(cpus)}
    interfaces = sorted({i for g in groups for i in g.network.interfaces})
    if interfaces:
        env["GLOO_SOCKET_IFNAME"] = ",".join(interfaces)
    if job.gpus_per_worker:
        if interfaces:
            env["NCCL_SOCKET_IFNAME"] = ",".join(interfaces)
        hcas = sorted({h for g in groups for h in g.network.infiniband})
        if hcas:
            env["NCCL_IB_HCA"] = ",".join(hcas)
        else:
            env["NCCL_IB_DISABLE"] = "1"  # no HCA declared: don't let NCCL probe for one
        gids = {g.network.ib_gid_index for g in groups if g.network.ib_gid_index is not None}
        if len(gids) == 1:
            env["NCCL_IB_GID_INDEX"] = str(gids.pop())
        gdr = {g.network.gdr_level for g in groups if g.network.gdr_level is not None}
        if len(gdr) == 1:
            env["NCCL_NET_GDR_LEVEL"] = gdr.pop()
        if job.nccl_debug:
            env["NCCL_DEBUG"] = job.nccl_debug
    return env


def resolve_storage(spec: ClusterSpec, base: Path | None = None) -> str:
    path = spec.storage.path
    if "://" in path:
        return path
    return str(((base or Path.cwd()) / path).resolve())


def plan(spec: ClusterSpec, job: JobRequest) -> Plan:
    groups = _eligible_groups(spec, job)
    cpus = _cpus_per_worker(groups, job)
    _check_capacity(groups, job, cpus)
    return Plan(
        workers=job.workers,
        cpus_per_worker=cpus,
        gpus_per_worker=job.gpus_per_worker,
        placement_strategy=RAY_STRATEGY[job.placement],
        backend="nccl" if job.gpus_per_worker else "gloo",
        env=collective_env(groups, job, cpus),
        storage_path=resolve_storage(spec),
        groups=tuple(g.name for g in groups),
        # A tiny amount of the group's resource pins workers to it without limiting how many fit.
        custom_resources={group_resource(job.node_group): 0.001} if job.node_group else {},
        gpu_type=_one_gpu_type(groups) if job.gpus_per_worker else None,
        **(hsdp_mesh(groups, job, cpus) if job.hsdp else {}),
    )


def hsdp_mesh(groups: list[NodeGroup], job: JobRequest, cpus: int) -> dict[str, Any]:
    """Plan's mesh (replicas, shard group size) and mesh_link. A shard group is the workers joined by the
    fastest link: an NVLink domain where the spec names one (within a node or across nodes), else a node
    (NVLink or PCIe); replicas go across groups (the network, InfiniBand). Refuses shapes that do not divide."""
    shard, link = _shard_group(groups, job, cpus)
    if job.workers % shard:
        raise ConfigError(f"hsdp: workers({job.workers}) do not divide into shard groups of {shard} (workers"
                          f" {link}): ask for a multiple of {shard} workers or set shard_size to a divisor")
    if shard > 1 and job.placement in ("spread", "strict-spread"):
        raise ConfigError(f"hsdp keeps each shard group of {shard} together ({link}): use placement pack or"
                          f" strict-pack, not {job.placement}")
    return {"mesh": (job.workers // shard, shard), "mesh_link": link}


def _shard_group(groups: list[NodeGroup], job: JobRequest, cpus: int) -> tuple[int, str]:
    """(workers per shard group, what joins them), before the workers asked for cap it."""
    if job.shard_size:
        return job.shard_size, "as shard_size asks"
    per_node = min(n for g in groups if (n := _workers_per_node(g, cpus, job.gpus_per_worker)) > 0)
    domains = {g.gpus.nvlink_domain for g in groups if g.gpus.count}
    if job.gpus_per_worker >= 1 and len(domains) == 1 and (domain := domains.pop()):
        return min(max(1, int(domain // job.gpus_per_worker)), job.workers), f"in one NVLink domain of {domain} GPUs"
    return min(per_node, job.workers), "on one node"


def _one_gpu_type(groups: list[NodeGroup]) -> str | None:
    types = {g.gpus.type for g in groups}
    return types.pop() if len(types) == 1 else None
