"""What a row says about the hardware, in one process (no Ray): model FLOPs counted on the meta device (MFU),
and the host telemetry of a rank. The 2-worker rows (telemetry across ranks, TensorBoard) are checked in
tests/test_ray_train.py."""

from __future__ import annotations

import os
import subprocess

import pytest
import torch

from orchestrator.launcher.summary import summarize, summary_lines
from orchestrator.raytrain.holders import holder_of, holders, holding
from trainables.config import TrainConfig
from trainables.data import build_datasets
from trainables.flops import flops_per_sample
from trainables.local import train_locally
from trainables.models import build_model
from trainables.objective import objective_of
from trainables.parallel.comm import busy_seconds
from trainables.run import dataset_of
from trainables.telemetry import HostTelemetry


def counted(cfg: TrainConfig) -> tuple[float | None, int]:
    """(FLOPs per sample, parameters); the count leaves the global RNG as it found it."""
    train, _, meta = build_datasets(cfg, dataset_of(cfg))
    params = sum(p.numel() for p in build_model(cfg.model, meta, cfg).parameters())
    before = torch.random.get_rng_state()
    flops = flops_per_sample(lambda: build_model(cfg.model, meta, cfg), train, objective_of(cfg))
    assert torch.equal(before, torch.random.get_rng_state())  # a resumed run stays bit-exact
    return flops, params


def test_flops_are_counted_for_transformers_and_convnets_and_leave_the_rng_alone():
    gpt, params = counted(TrainConfig(model="gpt-char", seq_len=64))
    # forward + backward = 6 x parameters x tokens, plus attention's own matmuls (nanoGPT's estimate)
    assert 6 * params * 64 <= gpt <= 1.2 * 6 * params * 64
    resnet, _ = counted(TrainConfig(model="resnet18", dataset="fake-images", image_size=224))
    assert resnet == pytest.approx(3 * 2 * 1.82e9, rel=0.03)  # 1.82 GMACs forward, backward twice that


def test_rows_carry_mfu_where_the_peak_is_known(tmp_path):
    cfg = {"model": "digits-cnn", "epochs": 1, "log_every": 5, "max_steps": 10}
    with_peak, _ = train_locally(TrainConfig(**cfg, peak_tflops=0.5), tmp_path / "peak")
    flops, _ = counted(TrainConfig(model="digits-cnn"))
    assert with_peak["mfu"] == pytest.approx(flops * with_peak["samples_per_s"] / 0.5e12, rel=1e-6)
    assert 0 < with_peak["mfu"] < 1 and with_peak["model_tflops"] == pytest.approx(with_peak["mfu"] * 0.5)
    without, _ = train_locally(TrainConfig(**cfg), tmp_path / "cpu")
    assert "mfu" not in without  # a CPU has no known peak


def test_host_telemetry_is_plausible():
    host = HostTelemetry()
    sum(i * i for i in range(2_000_000))  # some CPU time
    cpu_pct, rss = host.sample()
    assert 0 < cpu_pct <= 100 * os.cpu_count() and rss > 50


def test_allreduce_busy_time_is_the_union_of_the_bucket_intervals():
    # buckets overlap one another: the busy time counts each moment once
    assert busy_seconds([(1.0, 3.0), (0.0, 2.0), (5.0, 6.0), (5.5, 5.7)]) == 4.0
    assert busy_seconds([]) == 0.0


def test_a_gpu_process_is_named_by_the_worker_above_it():
    node = f"test-{os.getpid()}"  # a node id of this test's own
    with holding("myrun", 3, node), subprocess.Popen(["sleep", "30"]) as child:  # a script's child
        known = holders(node)
        assert known == {os.getpid(): "myrun/3"}
        assert holder_of(child.pid, known) == "myrun/3" and holder_of(1, known) is None
        child.kill()
    assert holders(node) == {}  # gone with the block


def test_the_summary_leaves_warm_up_out_of_rates_and_energy_per_sample_but_not_out_of_the_cost():
    def window(step: int, joules: float, samples: int, mem: float, rank: int) -> dict:
        return {"step": step, "loss": 1.0, "samples_per_s": samples / 2.0, "tokens_per_s": samples * 8 / 2.0,
                "gpu_energy_j_total": joules, "energy_j_per_sample": joules / samples,
                "energy_j_per_token": joules / samples / 8, "gpu_mem_mib_max": mem, "gpu_mem_mib_max_rank": rank,
                "gpu_util_pct_mean": 50.0 if step == 10 else 90.0}
    rows = [window(10, 900.0, 100, 1000.0, 0), window(20, 200.0, 100, 3000.0, 1), window(30, 400.0, 300, 2000.0, 0),
            {"step": 30, "loss": 1.0, "val_loss": 0.9, "gpu_mem_mib_max": 9999.0}]  # validation rows: not counted
    s = summarize(rows)
    assert s["gpu_energy_j"] == 1500.0  # every window's joules: the run's cost, compilation included
    assert s["energy_j_per_sample"] == 600.0 / 400 and s["energy_j_per_token"] == 600.0 / 400 / 8
    assert s["samples_per_s"] == 100.0 and s["gpu_util_pct"] == 90.0  # the first window is warm-up
    assert (s["peak_gpu_mem_mib"], s["peak_gpu_mem_mib_rank"]) == (3000.0, 1)
    assert any(line.startswith("energy: 1.5 kJ in all GPUs, 1.5 J/sample, 187.5 mJ/token")
               for line in summary_lines(s))
