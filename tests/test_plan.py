"""Planning decisions, pure: no Ray. Each refusal names the factors that do not fit."""

from __future__ import annotations

import re

import pytest

from cluster.plan import JobRequest, plan
from cluster.spec import ClusterSpec
from groundwork.errors import ConfigError
from orchestrator.config import resolve_launch
from trainables.config import TrainConfig, for_world


def spec(**overrides) -> ClusterSpec:
    data = {
        "name": "lab",
        "storage": {"path": "/mnt/shared/runs", "shared": True},
        "node_groups": [
            {"name": "head", "role": "head", "cpus": 8, "network": {"interfaces": ["eth0"]}},
            {"name": "gpu", "count": 2, "cpus": 64, "gpus": {"count": 8, "type": "H200"},
             "network": {"interfaces": ["eth0"], "infiniband": ["mlx5_0", "mlx5_1"], "ib_gid_index": 3}},
        ],
    }
    data.update(overrides)
    return ClusterSpec.model_validate(data)


def test_gpu_job_gets_nccl_env_from_the_spec():
    p = plan(spec(), JobRequest(workers=16, gpus_per_worker=1))
    assert p.backend == "nccl"
    assert p.groups == ("gpu",)
    assert p.resources_per_worker == {"CPU": 8, "GPU": 1}  # 64 CPUs shared by 8 one-GPU workers
    assert p.env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert p.env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1"
    assert p.env["NCCL_IB_GID_INDEX"] == "3"
    assert p.env["OMP_NUM_THREADS"] == "8"
    assert "NCCL_IB_DISABLE" not in p.env


def test_the_specs_gpu_type_gives_mfu_its_peak_unless_the_user_gave_one():
    from orchestrator.launcher.launch import for_plan  # deferred: imports Ray
    from trainables.config import TrainConfig

    gpu_plan = plan(spec(), JobRequest(workers=16, gpus_per_worker=1))
    assert gpu_plan.gpu_type == "H200" and plan(spec(), JobRequest(workers=2)).gpu_type is None  # CPU: no type
    assert for_plan(TrainConfig(precision="bf16"), gpu_plan).peak_tflops == 989.0  # dense bf16, datasheet
    a100 = plan(spec(node_groups=[{"name": "a", "role": "head", "cpus": 8, "gpus": {"count": 1, "type": "a100-80gb"}}]),
                JobRequest(workers=1, gpus_per_worker=1))
    assert for_plan(TrainConfig(precision="fp32"), a100).peak_tflops == 156.0  # TF32
    assert for_plan(TrainConfig(peak_tflops=700), gpu_plan).peak_tflops == 700  # --peak-tflops wins
    mi300 = plan(spec(node_groups=[{"name": "m", "role": "head", "cpus": 8, "gpus": {"count": 1, "type": "MI300X"}}]),
                 JobRequest(workers=1, gpus_per_worker=1))
    assert for_plan(TrainConfig(), mi300).peak_tflops is None  # not in the table: the GPU's own name decides


def test_hsdp_shards_within_a_node_and_replicates_across_nodes():
    from orchestrator.launcher.launch import for_plan  # deferred: imports Ray
    from trainables.config import TrainConfig

    p = plan(spec(), JobRequest(workers=16, gpus_per_worker=1, hsdp=True))
    assert p.mesh == (2, 8)  # two 8-GPU nodes: a shard group per node
    assert ("mesh (hsdp)", "2 replica(s) x 8 shard(s): parameters gathered within a group of 8 worker(s) on one"
            " node, gradients all-reduced across the groups") in p.describe()
    assert for_plan(TrainConfig(strategy="hsdp"), p).shard_size == 8
    assert plan(spec(), JobRequest(workers=16, gpus_per_worker=1, hsdp=True, shard_size=4)).mesh == (4, 4)
    with pytest.raises(ConfigError, match=r"hsdp: workers\(12\) do not divide into shard groups of 8 \(workers"
                       r" on one node\): ask for a multiple of 8"):
        plan(spec(), JobRequest(workers=12, gpus_per_worker=1, hsdp=True))
    with pytest.raises(ConfigError, match=r"hsdp keeps each shard group of 8 together \(on one node\): use placement"):
        plan(spec(), JobRequest(workers=16, gpus_per_worker=1, hsdp=True, placement="spread"))


def gpu_group(**gpus) -> dict:
    return {"name": "gpu", "count": 4, "cpus": 64, "gpus": {"count": 8, "type": "H200", **gpus}}


def test_hsdp_shards_within_the_nvlink_domain_the_spec_names():
    head = {"name": "head", "role": "head", "cpus": 8}
    paired = spec(node_groups=[head, gpu_group(nvlink_domain=2)])  # NVLink bridges join pairs of PCIe GPUs
    p = plan(paired, JobRequest(workers=16, gpus_per_worker=1, hsdp=True))
    assert p.mesh == (8, 2)
    assert ("mesh (hsdp)", "8 replica(s) x 2 shard(s): parameters gathered within a group of 2 worker(s) in one"
            " NVLink domain of 2 GPUs, gradients all-reduced across the groups") in p.describe()
    assert plan(paired, JobRequest(workers=8, gpus_per_worker=2, hsdp=True)).mesh == (8, 1)  # a worker per pair
    fabric = spec(node_groups=[head, gpu_group(nvlink_domain=16)])  # one NVSwitch fabric across two nodes
    assert plan(fabric, JobRequest(workers=32, gpus_per_worker=1, hsdp=True)).mesh == (2, 16)
    assert plan(fabric, JobRequest(workers=8, gpus_per_worker=1, hsdp=True)).mesh == (1, 8)
    with pytest.raises(ValueError, match="nvlink_domain 3 neither divides the node's 8 GPUs nor spans whole nodes"
                       " of them: give a divisor or a multiple of 8"):
        spec(node_groups=[head, gpu_group(nvlink_domain=3)])


def test_too_many_gpu_workers_names_the_factors():
    with pytest.raises(ConfigError, match=r"workers\(17\) x \[cpus\(8\), gpus\(1\)\] does not fit.*gpu: 2 node"):
        plan(spec(), JobRequest(workers=17, gpus_per_worker=1))


def test_more_gpus_per_worker_than_a_node_has():
    with pytest.raises(ConfigError, match=r"gpus_per_worker=16 but no node has that many GPUs \(head: 0, gpu: 8\)"):
        plan(spec(), JobRequest(workers=1, gpus_per_worker=16))


def test_cpu_job_shares_cpus_and_uses_gloo():
    local = spec(storage={"path": "runs"}, node_groups=[{"name": "local", "role": "head", "cpus": 2}])
    p = plan(local, JobRequest(workers=2))
    assert (p.backend, p.cpus_per_worker, p.placement_strategy) == ("gloo", 1, "PACK")
    assert p.storage_path.endswith("/runs") and p.storage_path.startswith("/")
    assert "GLOO_SOCKET_IFNAME" not in p.env


def test_no_infiniband_disables_nccl_ib():
    eth_only = spec(node_groups=[{"name": "gpu", "cpus": 16, "gpus": {"count": 2}}])
    assert plan(eth_only, JobRequest(workers=2, gpus_per_worker=1)).env["NCCL_IB_DISABLE"] == "1"


def test_strict_spread_needs_a_node_per_worker():
    two = spec(node_groups=[{"name": "a", "count": 2, "cpus": 4}])
    assert plan(two, JobRequest(workers=2, placement="strict-spread")).placement_strategy == "STRICT_SPREAD"
    with pytest.raises(ConfigError, match=r"strict-spread needs one node per worker: workers\(3\) > nodes"):
        plan(two, JobRequest(workers=3, cpus_per_worker=1, placement="strict-spread"))


def test_strict_pack_must_fit_one_node():
    two = spec(node_groups=[{"name": "a", "count": 2, "cpus": 4}])
    with pytest.raises(ConfigError, match=r"strict-pack needs all .* on one node, but at most 4 fit"):
        plan(two, JobRequest(workers=6, cpus_per_worker=1, placement="strict-pack"))


def test_node_group_pins_workers_with_a_custom_resource():
    p = plan(spec(), JobRequest(workers=2, gpus_per_worker=4, node_group="gpu"))
    assert p.resources_per_worker["node_group_gpu"] == pytest.approx(0.001)
    with pytest.raises(ConfigError, match="no node group named 'tpu'"):
        plan(spec(), JobRequest(node_group="tpu"))


@pytest.mark.parametrize("settings, match", [
    ({"workers": 0}, r"workers: Input should be greater than or equal to 1"),
    ({"gpus_per_worker": -1}, r"gpus_per_worker: Input should be greater than or equal to 0"),
    ({"placement": "scatter"}, r"placement: Input should be 'pack', 'spread'"),
])
def test_bad_job_requests(settings, match):
    # A JobRequest comes from a validated LaunchConfig: its bad values are refused there, once.
    with pytest.raises(ConfigError, match=match):
        resolve_launch(settings)


def test_a_one_worker_job_may_share_a_gpu_and_sweeps_count_the_shares():
    from orchestrator.sweeps.tuner import concurrent_trials

    p = plan(spec(), JobRequest(workers=1, gpus_per_worker=0.5))
    assert p.resources_per_worker == {"CPU": 4, "GPU": 0.5}  # 64 CPUs over the 16 half-GPU slots of a node
    assert p.backend == "nccl"
    # two nodes x 8 GPUs x 2 shares; the CPUs (2 x 64 / 4) allow 32 as well
    assert concurrent_trials(p, {"CPU": 128.0, "GPU": 16.0}) == 32
    whole = plan(spec(), JobRequest(workers=1, gpus_per_worker=1))
    assert concurrent_trials(whole, {"CPU": 128.0, "GPU": 16.0}) == 16


@pytest.mark.parametrize("workers, gpus, text", [
    (2, 0.5, "gpus_per_worker=0.5 shares a GPU, which only a 1-worker job may do"),
    (1, 1.5, "gpus_per_worker=1.5: above 1 it must be a whole number"),
])
def test_gpu_fractions_that_cannot_work_are_refused(workers, gpus, text):
    with pytest.raises(ConfigError, match=re.escape(text)):
        resolve_launch({"workers": workers, "gpus_per_worker": gpus})


def test_a_cross_field_rule_in_a_file_names_its_line(tmp_path):
    (tmp_path / "launch.yaml").write_text("workers: 2\ngpus_per_worker: 0.5\n")
    with pytest.raises(ConfigError, match=r"launch.yaml:2: gpus_per_worker: gpus_per_worker=0.5 shares a GPU"):
        resolve_launch({}, config_file=str(tmp_path / "launch.yaml"))


@pytest.mark.parametrize("given, workers, least", [("1..4", 4, 1), (" 2 .. 3 ", 3, 2), ({"min": 2, "max": 2}, 2, None),
                                                   (3, 3, None), ("3", 3, None)])
def test_workers_min_max_sets_the_elastic_range(given, workers, least):
    cfg = resolve_launch({"workers": given})
    assert (cfg.workers, cfg.min_workers) == (workers, least)
    assert cfg.job_request().workers == workers  # the plan places the most


def test_an_elastic_run_with_fewer_workers_keeps_the_planned_global_batch():
    cfg = TrainConfig(batch_size=16, grad_accum=1)
    same, line = for_world(cfg, 2, 2)
    assert same is cfg and line is None
    fewer, line = for_world(cfg, 1, 2)  # half the workers: twice the micro-batches
    assert (fewer.batch_size, fewer.grad_accum) == (16, 2) and "global batch at 32" in line
    odd, _ = for_world(cfg, 2, 3)  # 3 x 16 over 2 workers: a larger batch each
    assert (odd.batch_size, odd.grad_accum) == (24, 1)
    kept, line = for_world(cfg, 3, 4)  # 64 samples do not split over 3 workers: said, not hidden
    assert kept is cfg and "does not split evenly" in line
