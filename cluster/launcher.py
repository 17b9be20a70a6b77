"""`orchestrator cluster render`: a Ray cluster-launcher YAML (`ray up`) from the hardware spec.

Each node group becomes an available_node_type whose resources are its CPUs, GPUs and a `node_group_<name>`
custom resource (so `--node-group` can pin workers to it), with one more custom resource per InfiniBand island
(`ib_<hca>`). The start commands export the NCCL/gloo environment the plan derives from the same spec, so what
Ray Train workers see on the nodes is what `orchestrator plan` prints.
"""

from __future__ import annotations

import shlex
from typing import Any

from cluster.plan import JobRequest, collective_env, group_resource
from cluster.spec import ClusterSpec, NodeGroup

GROUP_RESOURCE_UNITS = 1000  # integer units (the schema wants ints); jobs ask 0.001 of one
ENV_FILE = "~/.orchestrator_env"  # written per node type at setup, sourced by the start command


def node_resources(group: NodeGroup) -> dict[str, int]:
    res = {"CPU": group.cpus, group_resource(group.name): GROUP_RESOURCE_UNITS}
    if group.gpus.count:
        res["GPU"] = group.gpus.count
    if group.network.infiniband:
        res["ib_" + "_".join(sorted(group.network.infiniband))] = GROUP_RESOURCE_UNITS
    return res


def env_exports(group: NodeGroup) -> str:
    job = JobRequest(gpus_per_worker=1 if group.gpus.count else 0)
    env = collective_env([group], job, group.cpus)
    env.pop("OMP_NUM_THREADS")  # Ray Train sets it per worker from its CPUs
    return "\n".join(f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items()))


def write_env_command(group: NodeGroup) -> str:
    """A setup command that leaves this group's NCCL/gloo environment where the start command finds it
    (each launcher command runs in its own shell, so a plain export would not last)."""
    return f"printf '%s\\n' {shlex.quote(env_exports(group))} > {ENV_FILE}"


def _provider(spec: ClusterSpec) -> dict[str, Any]:
    if spec.launcher.provider is not None:
        return dict(spec.launcher.provider)
    head = spec.head
    if not head.ips:
        raise ValueError(f"group {head.name!r} needs ips: the on-prem (local) provider must know the head's address")
    workers = [ip for g in spec.node_groups for ip in g.ips if g is not head]
    return {"type": "local", "head_ip": head.ips[0], "worker_ips": workers}


def render(spec: ClusterSpec) -> dict[str, Any]:
    head = spec.head
    port = spec.launcher.port
    node_types = {}
    for g in spec.node_groups:
        count = g.count - (1 if g is head else 0)
        node_types[g.name] = {"resources": node_resources(g), "node_config": {},
                              "min_workers": count, "max_workers": count}
        if g is not head:
            node_types[g.name]["worker_setup_commands"] = [write_env_command(g)]
    auth: dict[str, Any] = {"ssh_user": spec.launcher.ssh_user}
    if spec.launcher.ssh_private_key:
        auth["ssh_private_key"] = spec.launcher.ssh_private_key
    return {
        "cluster_name": spec.name,
        "max_workers": sum(t["max_workers"] for t in node_types.values()),
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": 5,
        "provider": _provider(spec),
        "auth": auth,
        "available_node_types": node_types,
        "head_node_type": head.name,
        "file_mounts": {},
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
        "initialization_commands": [],
        "setup_commands": list(spec.launcher.setup_commands),
        "head_setup_commands": [write_env_command(head)],
        "worker_setup_commands": [],
        "head_start_ray_commands": [
            "ray stop",
            f". {ENV_FILE}; ulimit -n 65536; ray start --head --port={port} --include-dashboard=false"
            " --autoscaling-config=~/ray_bootstrap_config.yaml",
        ],
        "worker_start_ray_commands": [
            "ray stop",
            # one start command for every worker type: the env file and the resources differ per type
            f". {ENV_FILE}; ray start --address=$RAY_HEAD_IP:{port}",
        ],
    }
