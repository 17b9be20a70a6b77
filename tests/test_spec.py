"""Cluster specs: the shipped examples load; every malformed one fails with file:line: field: message."""

from __future__ import annotations

import pytest
from conftest import DATA, REPO, run_cli

from cluster.spec import load_spec
from groundwork.errors import ConfigError
from groundwork.yamlio import parse_yaml_text

BAD = DATA / "bad_inputs"

# file -> (line, text that must be in the message)
EXPECTED = {
    "cluster-unknown-key.yaml": (5, "node_groups[0].gpu: unknown key"),
    "cluster-negative-gpus.yaml": (6, "node_groups[0].gpus.count: Input should be greater than or equal to 0"),
    "cluster-missing-node-groups.yaml": (1, "node_groups: required field is missing"),
    "cluster-empty-node-groups.yaml": (2, "node_groups: List should have at least 1 item"),
    "cluster-duplicate-key.yaml": (5, "duplicate key 'cpus'"),
    "cluster-yes-is-not-bool.yaml": (4, "storage.shared: Input should be a valid boolean"),
    "cluster-bad-interface.yaml": (6, "'eth 0' is not an interface/HCA name"),
    "cluster-two-heads.yaml": (1, "exactly one head node"),
    "cluster-local-storage-multinode.yaml": (1, "node-local but the cluster has 4 nodes"),
    "cluster-not-yaml.yaml": (3, "not valid YAML"),
    "cluster-alias-bomb.yaml": (2, "more than 10000 values once its aliases are expanded"),
    "cluster-bad-address.yaml": (2, "address: 'head-node' is not a Ray address: give host:port"),
    "cluster-nvlink-domain.yaml": (6, "nvlink_domain 3 neither divides the node's 8 GPUs nor spans whole nodes"),
    "cluster-storage-unknown-scheme.yaml": (3, "storage.path: pyarrow has no sftp:// filesystem"),
}


def test_every_bad_spec_is_covered():
    assert sorted(p.name for p in BAD.glob("cluster-*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bad_spec_names_file_line_and_field(name):
    line, text = EXPECTED[name]
    with pytest.raises(ConfigError) as info:
        load_spec(BAD / name)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{BAD / name}:{line}: "), message
    assert text in message


@pytest.mark.parametrize("name", ["cluster-unknown-key.yaml", "cluster-negative-gpus.yaml",
                                  "cluster-missing-node-groups.yaml"])
def test_cli_bad_spec_exits_2_with_one_line(name):
    proc = run_cli("cluster", "validate", str(BAD / name))
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("orchestrator: error: "), proc.stderr
    assert EXPECTED[name][1] in lines[0]


def test_launch_with_bad_spec_writes_nothing(tmp_path):
    proc = run_cli("launch", "--cluster", str(BAD / "cluster-negative-gpus.yaml"), "--name", "x", cwd=tmp_path)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_examples_load():
    local = load_spec(REPO / "cluster/examples/local.yaml")
    assert local.num_nodes == 1 and local.node_groups[0].cpus >= 1
    assert local.node_groups[0].network.interfaces == ["lo"]
    multi = load_spec(REPO / "cluster/examples/multi-node.yaml")
    assert multi.num_nodes == 3 and multi.total_gpus == 16
    assert multi.group("gpu").network.infiniband == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]


def test_yaml_12_booleans_only():
    doc = parse_yaml_text("a: no\nb: true\nc: off\n", "t.yaml")
    assert doc.data == {"a": "no", "b": True, "c": "off"}
    assert doc.lines[("b",)] == 2
