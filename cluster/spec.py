"""The hardware description: what a cluster has, validated when it is built.

A spec is a list of node groups (a group is `count` identical nodes). The first group whose role is `head`
holds the Ray head. Everything is checked at construction, so a plan never sees an impossible cluster.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cluster.detect import detect
from groundwork.address import check_address
from groundwork.errors import ConfigError
from groundwork.remote import check_scheme, is_node_local, is_uri
from groundwork.yamlio import read_yaml, validate_doc

_IFNAME = r"^[A-Za-z0-9_.:@-]{1,15}$"  # Linux IFNAMSIZ is 16 including the NUL
DEFAULT_SPEC = Path(__file__).resolve().parent / "examples" / "local.yaml"  # this machine, all `auto`


class _Strict(BaseModel):
    # strict: no "yes" -> True or "8" -> 8 coercion; a YAML value must already have the field's type.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class GPUs(_Strict):
    count: int = Field(0, ge=0, le=64, description="GPUs per node")
    type: str | None = Field(None, description="e.g. H200, A100-80GB; checked against the live cluster")
    memory_gb: float | None = Field(None, gt=0)
    nvlink_domain: int | None = Field(
        None, ge=1, description="GPUs joined by one NVLink/NVSwitch fabric: none = a node's GPUs; fewer where"
        " bridges pair them (2), more where the fabric spans nodes (GB200 NVL72: 72); hsdp shards within one")

    @model_validator(mode="after")
    def _domain_tiles_nodes(self) -> GPUs:
        domain, count = self.nvlink_domain, self.count
        if domain and count and domain % count and count % domain:
            raise ValueError(f"nvlink_domain {domain} neither divides the node's {count} GPUs nor spans whole"
                             f" nodes of them: give a divisor or a multiple of {count}")
        return self


class Network(_Strict):
    """How a node's processes reach each other: the socket interface and any InfiniBand/RoCE HCAs."""

    interfaces: list[str] = Field(default_factory=list, description="socket interfaces, e.g. [eth0]")
    infiniband: list[str] = Field(default_factory=list, description="HCA names, e.g. [mlx5_0, mlx5_1]")
    ib_gid_index: int | None = Field(None, ge=0, description="RoCE GID index (NCCL_IB_GID_INDEX)")
    gdr_level: Literal["LOC", "PIX", "PXB", "PHB", "SYS"] | None = Field(
        None, description="GPUDirect RDMA distance (NCCL_NET_GDR_LEVEL)"
    )

    @field_validator("interfaces", "infiniband")
    @classmethod
    def _names(cls, names: list[str]) -> list[str]:
        for name in names:
            if not re.match(_IFNAME, name):
                raise ValueError(f"{name!r} is not an interface/HCA name (letters, digits, ._:@-; <= 15 chars)")
        if len(set(names)) != len(names):
            raise ValueError(f"names repeat in {names}: list each once")
        return names


class NodeGroup(_Strict):
    name: str = Field(pattern=r"^[a-z][a-z0-9_-]*$")
    role: Literal["head", "worker"] = "worker"
    count: int = Field(1, ge=1, le=10_000)
    cpus: int = Field(ge=1, description="logical CPUs per node")
    memory_gb: float | None = Field(None, gt=0)
    gpus: GPUs = Field(default_factory=GPUs)
    network: Network = Field(default_factory=Network)
    ips: list[str] = Field(default_factory=list, description="node addresses, for the on-prem launcher")
    labels: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _resolve_auto(cls, data: object) -> object:
        """`auto` means "what this machine has": the default local spec uses it for CPUs and GPUs."""
        if not isinstance(data, dict):
            return data
        gpus = data.get("gpus")
        wants_auto = data.get("cpus") == "auto" or data.get("memory_gb") == "auto" or (
            isinstance(gpus, dict) and "auto" in gpus.values()
        )
        if not wants_auto:
            return data
        hw = detect()
        data = dict(data)
        if data.get("cpus") == "auto":
            data["cpus"] = hw.cpus
        if data.get("memory_gb") == "auto":
            data["memory_gb"] = hw.memory_gb
        if isinstance(gpus, dict):
            detected = {"count": hw.gpus, "type": hw.gpu_type, "memory_gb": hw.gpu_memory_gb}
            data["gpus"] = {k: detected[k] if v == "auto" and k in detected else v for k, v in gpus.items()}
        network = data.get("network")
        if isinstance(network, dict) and network.get("interfaces") == ["auto"]:
            data["network"] = {**network, "interfaces": [hw.loopback]}
        return data

    @model_validator(mode="after")
    def _ips_match_count(self) -> NodeGroup:
        if self.ips and len(self.ips) != self.count:
            raise ValueError(f"group {self.name!r}: {len(self.ips)} ips listed but count is {self.count}")
        return self


class Storage(_Strict):
    path: str = Field("runs", min_length=1, description="where runs and checkpoints go: a folder, or a URI that"
                      " pyarrow opens (s3://bucket/runs, gs://, hdfs://, file:///mnt/runs)")
    shared: bool = Field(False, description="true when every node sees this path (NFS, Lustre, a bucket)")

    @field_validator("path")
    @classmethod
    def _known_scheme(cls, path: str) -> str:
        if is_uri(path):  # reaching it is preflight's check: validating a spec asks no network
            try:
                check_scheme(path)
            except ConfigError as exc:
                raise ValueError(str(exc).removeprefix(f"storage.path {path}: ")) from None
        return path


class Launcher(_Strict):
    """What `orchestrator cluster render` needs beyond the hardware: how to reach the nodes."""

    ssh_user: str = "ubuntu"
    ssh_private_key: str | None = None
    provider: dict[str, object] | None = Field(
        None, description="a cloud provider block passed through to Ray (aws, gcp, ...); default: local (on-prem)")
    setup_commands: list[str] = Field(default_factory=list, description="run on every node before Ray starts")
    port: int = Field(6379, ge=1, le=65535, description="the Ray head's GCS port")


class ClusterSpec(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    address: str | None = Field(None, description="Ray address to join, e.g. 10.0.0.1:6379; none = start local")
    storage: Storage = Field(default_factory=Storage)
    node_groups: list[NodeGroup] = Field(min_length=1)
    launcher: Launcher = Field(default_factory=Launcher)

    @field_validator("address")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        return value if value is None else check_address(value)

    @model_validator(mode="after")
    def _consistent(self) -> ClusterSpec:
        names = [g.name for g in self.node_groups]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"node group names repeat: {dupes}: give each group its own name")
        heads = [g for g in self.node_groups if g.role == "head"]
        if len(heads) > 1 or (heads and heads[0].count != 1):
            raise ValueError("exactly one head node is allowed: one group with role: head and count: 1")
        if self.num_nodes > 1 and not self.storage.shared and not _bucket(self.storage.path):
            raise ValueError(
                f"storage.path {self.storage.path!r} is node-local but the cluster has {self.num_nodes} nodes:"
                " set storage.shared: true for a shared filesystem, or use a bucket URI"
            )
        return self

    @property
    def head(self) -> NodeGroup:
        """The group that holds the Ray head: the one with role head, else the first."""
        return next((g for g in self.node_groups if g.role == "head"), self.node_groups[0])

    @property
    def num_nodes(self) -> int:
        return sum(g.count for g in self.node_groups)

    @property
    def total_gpus(self) -> int:
        return sum(g.count * g.gpus.count for g in self.node_groups)

    @property
    def total_cpus(self) -> int:
        return sum(g.count * g.cpus for g in self.node_groups)

    def group(self, name: str) -> NodeGroup:
        for g in self.node_groups:
            if g.name == name:
                return g
        raise ValueError(f"no node group named {name!r}: the spec has {[g.name for g in self.node_groups]}")


def _bucket(path: str) -> bool:
    """A URI every node reaches by itself (s3://, gs://, hdfs://); file:// is a folder of each node's own."""
    return is_uri(path) and not is_node_local(path)


def load_spec(path: str | Path | None = None) -> ClusterSpec:
    """Read and validate a cluster YAML (default: this machine's); any problem is one ConfigError line naming
    file, line and field."""
    return validate_doc(ClusterSpec, read_yaml(path or DEFAULT_SPEC))
