"""The names of the numbers the shared loop reports: its rows (see loop.Meter, health.Health), its
validation and each epoch's report. A sweep over the loop may only name one of these as its metric
(checked before anything starts: Tune would refuse the first trial's first report)."""

from __future__ import annotations

# Each rank's own figures (host, GPU through NVML, DDP's all-reduce), reported across ranks as NAME_mean,
# NAME_max and NAME_max_rank (see health.spread).
PER_RANK = ("cpu_pct", "rss_mib", "gpu_util_pct", "gpu_mem_mib", "gpu_power_w", "gpu_energy_j", "gpu_max_alloc_mib",
            "allreduce_ms_per_step", "allreduce_share", "allreduce_mib_per_step")
SPREAD = ("mean", "max", "max_rank")
WHOLE = ("step", "epoch", "loss", "lr", "samples_per_s", "tokens_per_s", "world_size", "val_time_s",
         "checkpoint_time_s", "mfu", "model_tflops", "slowest_rank", "slowest_rank_ratio", "gpu_energy_j_total",
         "energy_j_per_sample", "energy_j_per_token", "skipped_steps", "preemption_notice", "val_loss", "val_acc",
         "train_time_s")
LOOP_METRICS = frozenset((*WHOLE, *(f"{name}_{stat}" for name in PER_RANK for stat in SPREAD)))
