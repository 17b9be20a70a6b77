"""TrainConfig: everything the shared loop needs to know, typed and checked when it is built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationInfo, model_validator

from trainables.factories import IMPORT_PATH

Precision = Literal["fp32", "bf16", "fp16", "fp8"]
# true/false only: pydantic would otherwise take "yes", "on" or "1" from a YAML file as True
Flag = Annotated[bool, Strict()]


SHARDED = ("fsdp", "hsdp")


@dataclass(frozen=True)
class ActsWith:
    """A setting that acts only where another one (`on`) has one of `values`: given otherwise (a value other
    than its default), it would do nothing, and the run would not be the one asked for."""

    on: str
    values: tuple[str, ...]
    fix: str  # what makes it act


SEARCHED = "searched"  # validation context: the settings a sweep searches (its base may hold what acts with them)
ACTS_ONLY_WITH = {
    "fp8_recipe": ActsWith("precision", ("fp8",), "--precision fp8"),
    "cpu_offload": ActsWith("strategy", SHARDED, "--strategy fsdp"),
    "reshard_after_forward": ActsWith("strategy", SHARDED, "--strategy fsdp"),
    "meta_init": ActsWith("strategy", SHARDED, "--strategy fsdp"),
    "checkpoint_format": ActsWith("strategy", SHARDED, "--strategy fsdp"),
    "checkpoint_async": ActsWith("checkpoint_format", ("sharded",), "--checkpoint-format sharded"),
    "shard_size": ActsWith("strategy", ("hsdp",), "--strategy hsdp"),
    "grad_compression": ActsWith("strategy", ("ddp", "model-parallel"), "--strategy ddp"),
    "powersgd_rank": ActsWith("grad_compression", ("powersgd",), "--grad-compression powersgd"),
    "powersgd_warmup": ActsWith("grad_compression", ("powersgd",), "--grad-compression powersgd"),
    "stages": ActsWith("strategy", ("model-parallel",), "--strategy model-parallel"),
    "micro_batches": ActsWith("strategy", ("model-parallel",), "--strategy model-parallel"),
    "split": ActsWith("strategy", ("model-parallel",), "--strategy model-parallel"),
}


def step_window(text: str) -> tuple[int, int]:
    """"N-M" (profile_steps) as (N, M)."""
    first, last = (int(part) for part in text.split("-"))
    return first, last


class TrainConfig(BaseModel):
    """One training run's settings. Batch size is per worker: the global batch is batch_size x workers x
    grad_accum, as in torchrun/DDP."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # a finite number where one is meant

    model: str = Field("digits-cnn", description="a built-in model, or your own factory: package.module:function")
    dataset: str | None = Field(None, description="default: the built-in model's own (digits, stdlib-text,"
                                " fake-images); or your own factory: package.module:function")
    loss: str | None = Field(
        None, pattern=IMPORT_PATH.pattern, description="package.module:fn(output, target) for your own loss;"
        " default: the model's own loss if its output holds one, else cross-entropy")
    data_path: str | None = Field(None, description="a .parquet file or folder, for dataset: parquet")
    epochs: int = Field(3, ge=1)
    max_steps: int | None = Field(None, ge=1, description="stop after this many optimizer steps in all")
    stop_after_epochs: int | None = Field(
        None, ge=1, description="end this session after N epochs with a checkpoint; --resume continues"
    )
    batch_size: int = Field(32, ge=1, description="per worker")
    grad_accum: int = Field(1, ge=1, description="micro-batches per optimizer step")
    optimizer: Literal["adamw", "sgd"] = "adamw"
    lr: float = Field(2e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    lr_schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    grad_clip: float | None = Field(None, gt=0)
    skip_nonfinite: Flag = Field(False, description="skip optimizer steps whose gradients are nan/inf (one host"
                                 " sync per step) instead of stopping the run at the first non-finite loss")
    precision: Precision = Field("fp32", description="fp8: torchao's float8 training of the linear layers (the"
                                 " rest in bf16), on GPUs with float8 (compute capability 8.9+: Ada, Hopper)")
    fp8_recipe: Literal["tensorwise", "rowwise"] = Field("tensorwise", description="fp8: one scale per tensor, or"
                                                         " per row (more accurate, a little slower)")
    strategy: Literal["ddp", "fsdp", "hsdp", "model-parallel", "dp"] = Field(
        "ddp", description="ddp: a replica per worker; fsdp: parameters, gradients and optimizer state sharded"
        " over the workers (FSDP2); hsdp: sharded within a node, replicated across nodes; model-parallel: stages"
        " over the worker's devices, DDP across workers; dp: legacy torch.nn.DataParallel inside one worker")
    reshard_after_forward: Flag = Field(True, description="fsdp/hsdp: free each block's gathered parameters after"
                                        " its forward (gathered again in backward): less memory, more traffic")
    shard_size: int | None = Field(None, ge=1, description="hsdp: workers per shard group (default: those that"
                                   " share a node, from the cluster spec)")
    cpu_offload: Flag = Field(False, description="fsdp/hsdp: keep the parameter shards, gradients and optimizer"
                              " state in CPU memory (the optimizer steps on the CPU)")
    meta_init: Flag = Field(True, description="fsdp/hsdp: build the model on rank 0 only (the other workers on the"
                            " meta device) and broadcast its weights into every worker's shards: one copy of the"
                            " model in host memory, not one per worker (--no-meta-init: a model that cannot be"
                            " built on the meta device)")
    activation_checkpointing: Literal["none", "full", "selective", "op"] = Field(
        "none", description="recompute blocks' activations in backward instead of keeping them: every block"
        " (full), every second one (selective), or in every block only the cheap ops: norms, RoPE, activations,"
        " keeping every matmul's and attention's output (op)")
    grad_compression: Literal["none", "fp16", "bf16", "powersgd"] = Field(
        "none", description="ddp: compress gradients before the all-reduce (PyTorch's DDP comm hooks)")
    powersgd_rank: int = Field(1, ge=1, description="powersgd: the rank of the low-rank approximation")
    powersgd_warmup: int = Field(10, ge=2, description="powersgd: plain all-reduce for the first N steps (DDP's"
                                 " first two at least)")
    stages: int | None = Field(None, ge=1, description="model-parallel stages; default: the worker's devices")
    micro_batches: int = Field(4, ge=1, description="model-parallel micro-batches per batch (GPipe)")
    split: list[int] | None = Field(None, description="model-parallel: first layer index of each stage")
    compile: Flag = Field(False, description="torch.compile the model (before DDP wraps it)")
    channels_last: Flag = Field(False, description="NHWC memory format for image models (faster convs on GPU)")
    seed: int = 0
    deterministic: Flag = Field(False, description="torch.use_deterministic_algorithms, for exact resume tests")
    checkpoint_format: Literal["full", "sharded"] = Field(
        "full", description="full: rank 0 writes the whole state; sharded (fsdp/hsdp): every rank writes its"
        " shards (torch.distributed.checkpoint) to the run's folder, which the nodes must share")
    checkpoint_async: Flag = Field(False, description="checkpoint_format sharded: write each checkpoint in the"
                                   " background (torch.distributed.checkpoint.async_save): training goes on once"
                                   " the shards are copied to host memory")
    checkpoint_every: int = Field(0, ge=0, description="optimizer steps between checkpoints; 0: each epoch")
    checkpoints: Flag = Field(True, description="write checkpoints (--no-checkpoints: none, for benchmarks whose"
                              " state outgrows the disk; such a run cannot be resumed)")
    profile_steps: str | None = Field(None, pattern=r"^\d+-\d+$", description="N-M: trace optimizer steps N..M"
                                      " of rank 0 with torch.profiler into <run>/profile/")
    log_every: int = Field(10, ge=1, description="optimizer steps between metric rows (one host sync each)")
    loader_workers: int = Field(0, ge=0, description="DataLoader worker processes per training worker")
    seq_len: int = Field(128, ge=2, description="tokens per sample, for text datasets")
    val_fraction: float = Field(0.2, gt=0, lt=1)
    fake_samples: int = Field(2048, ge=1, description="size of the synthetic datasets")
    telemetry: Flag = Field(True, description="CPU, memory, GPU (NVML) figures and MFU in the rows")
    peak_tflops: float | None = Field(None, gt=0, description="one device's peak TFLOP/s, for MFU (default: NVIDIA's"
                                      " figure for the GPU's name; none on CPU)")
    image_size: int = Field(64, ge=8, description="side of synthetic images")

    @property
    def sharded(self) -> bool:
        """FSDP2 holds the model: fsdp, or hsdp (sharded within a group, replicated across groups)."""
        return self.strategy in SHARDED

    @model_validator(mode="after")
    def _parquet_needs_path(self) -> TrainConfig:
        if self.dataset == "parquet" and not self.data_path:
            raise ValueError("dataset parquet needs data_path: the .parquet file or folder to read")
        if self.strategy == "model-parallel" and self.micro_batches > self.batch_size:
            raise ValueError(f"micro_batches({self.micro_batches}) > batch_size({self.batch_size})")
        if self.split is not None and self.stages is not None and len(self.split) != self.stages:
            raise ValueError(f"split has {len(self.split)} stage starts but stages is {self.stages}")
        if self.profile_steps and not 1 <= step_window(self.profile_steps)[0] <= step_window(self.profile_steps)[1]:
            raise ValueError(f"profile_steps {self.profile_steps}: need 1 <= N <= M")
        if self.stop_after_epochs is not None and self.stop_after_epochs > self.epochs:
            raise ValueError(f"stop_after_epochs({self.stop_after_epochs}) > epochs({self.epochs})")
        return self

    @model_validator(mode="after")
    def _each_setting_acts(self, info: ValidationInfo) -> TrainConfig:
        """Refuse a setting given where it does nothing (see ACTS_ONLY_WITH), unless what it acts with is
        searched (a sweep's base, validated with the space's keys as context SEARCHED)."""
        searched = (info.context or {}).get(SEARCHED, ())
        idle = [name for name in idle_settings(dict(self)) if ACTS_ONLY_WITH[name].on not in searched]
        if idle:
            name, value = idle[0], getattr(self, idle[0])
            needs = ACTS_ONLY_WITH[name]
            given = (name if value else f"{name} false") if isinstance(value, bool) else f"{name} {value}"
            raise ValueError(f"{given} needs {needs.on} {' or '.join(needs.values)} (it is {getattr(self, needs.on)}):"
                             f" add {needs.fix}, or leave {name} out")
        return self


def idle_settings(settings: dict[str, Any]) -> list[str]:
    """The settings among `settings` (TrainConfig's, by name; a missing one has its default) given where they
    do nothing (see ACTS_ONLY_WITH)."""
    def value(name: str) -> Any:
        return settings.get(name, TrainConfig.model_fields[name].default)

    return [name for name, needs in ACTS_ONLY_WITH.items()
            if value(name) != TrainConfig.model_fields[name].default and value(needs.on) not in needs.values]


def for_world(cfg: TrainConfig, world: int, planned: int) -> tuple[TrainConfig, str | None]:
    """`cfg`, planned for `planned` workers, on `world` of them (an elastic run that started or restarted
    with fewer, or grew) with the same global batch: more micro-batches per step where they divide evenly,
    else a larger per-worker batch; and a line saying what changed (None: nothing did)."""
    if world == planned or planned < 1:
        return cfg, None
    samples = cfg.batch_size * cfg.grad_accum * planned  # the global batch the run was planned with
    if (cfg.grad_accum * planned) % world == 0:
        changed = cfg.model_copy(update={"grad_accum": cfg.grad_accum * planned // world})
    elif samples % (world * cfg.grad_accum) == 0:
        changed = cfg.model_copy(update={"batch_size": samples // (world * cfg.grad_accum)})
    else:
        return cfg, (f"{world} of {planned} workers: a global batch of {samples} does not split evenly over them;"
                     f" it is {cfg.batch_size * cfg.grad_accum * world} now")
    return changed, (f"{world} of {planned} workers: batch_size {changed.batch_size} x grad_accum"
                     f" {changed.grad_accum} per worker keeps the global batch at {samples}")
