"""LaunchConfig: a training run's settings (TrainConfig) plus where and how wide it runs, and the one place a
launch's settings are resolved: flags, a `--config FILE` (e.g. a sweep's best.yaml), Python keywords, or the
launch.yaml of a run being resumed.

Every rule that needs two settings lives here, on the object that sees both (the fractional-GPU rule, dp's one
worker), so a bad value is refused with `file:line: field: message` before anything is planned or started. The
cluster's JobRequest is derived from a config validated here and is not checked again.
"""

from __future__ import annotations

import math
import re
import tempfile
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from cluster.plan import JobRequest, Placement, resolve_storage
from cluster.spec import load_spec
from groundwork.address import CONNECT_TIMEOUT_S, check_address
from groundwork.errors import ConfigError
from groundwork.remote import RunPlace
from groundwork.yamlio import read_yaml, validate_doc, validation_message
from trainables.config import Flag, TrainConfig, idle_settings

RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
LAUNCH_FILE = "launch.yaml"  # in every run folder: what the run started with
USER_PREFIX = "user."  # a sweep space's or a flat setting's name for one of the user's own settings


TEXT_FLAG = {"flag_type": "str"}  # a field whose flag takes text the model parses (workers: 2 or 1..4)
WORKER_RANGE = re.compile(r"^\s*(\d+)\s*\.\.\s*(\d+)\s*$")


def worker_range(value: Any) -> dict[str, Any]:
    """`workers` as given ("1..4", {min: 1, max: 4}, 2, "2") as the fields workers and min_workers."""
    if isinstance(value, dict) and set(value) == {"min", "max"}:
        least, most = value["min"], value["max"]
    elif isinstance(value, str) and (match := WORKER_RANGE.match(value)):
        least, most = int(match.group(1)), int(match.group(2))
    elif isinstance(value, str) and ".." in value or isinstance(value, dict):
        raise ValueError(f"workers {value!r}: give a count (2), or MIN..MAX (1..4; in YAML also {{min: 1, max: 4}})")
    else:
        return {"workers": value}
    if isinstance(least, int) and isinstance(most, int) and not 1 <= least <= most:
        raise ValueError(f"workers {least}..{most}: give 1 <= MIN <= MAX")
    return {"workers": most, "min_workers": least}


class LaunchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)  # a finite number where one is meant

    train: TrainConfig = Field(default_factory=TrainConfig)
    workers: int = Field(2, ge=1, description="Ray Train workers (DDP ranks); MIN..MAX: elastic, from MIN up to"
                         " MAX as nodes allow, going on with fewer after a node is lost", json_schema_extra=TEXT_FLAG)
    min_workers: int | None = Field(None, ge=1, description="elastic: the fewest workers the run goes on with (set"
                                    " by workers MIN..MAX, or `workers: {min: 1, max: 4}`)")
    gpus_per_worker: float = Field(0, ge=0, description="GPUs per worker; a fraction (e.g. 0.5) lets 1-worker"
                                   " jobs, such as sweep trials, share a GPU")
    cpus_per_worker: int | None = Field(None, ge=1, description="default: the node's CPUs shared out")
    placement: Placement = "pack"
    node_group: str | None = None
    cluster: str | None = Field(None, description="cluster spec YAML; default: this machine")
    address: str | None = Field(None, description="Ray cluster to join; default: start an embedded local Ray")
    connect_timeout: float = Field(CONNECT_TIMEOUT_S, gt=0, description="seconds to wait for --address to answer")
    name: str | None = Field(None, description="run folder name; default: <model or entry function>-<time>")
    entry: str | None = Field(None, description="module:function run in each worker instead of the shared loop")
    script: str | None = Field(None, description="a torchrun script to run unmodified, one process per worker;"
                               " its arguments follow `--`")
    module: str | None = Field(None, description="as --script, for a module run as `python -m MODULE`")
    args: list[str] = Field(default_factory=list, description="the script's arguments (after `--` on the CLI)")
    tee: Flag = Field(False, description="a script's every rank to the terminal, not only rank 0")
    user: dict[str, Any] = Field(default_factory=dict, description="your own settings, by name: passed to your"
                                 " model/dataset factories and `entry` function (--set key=value)")
    datasets: dict[str, str] = Field(default_factory=dict, description="name -> Parquet file or folder: Ray Data"
                                     " datasets an `entry` function reads with ray.train.get_dataset_shard(name)")
    keep_checkpoints: int = Field(2, ge=1)
    max_failures: int = Field(0, ge=0, description="worker-group restarts from the latest checkpoint")
    hang_timeout: float = Field(300.0, gt=0, description="seconds a rank may make no progress before the run"
                                " is ended as hung (first steps and torch.compile count: raise it for them)")
    quiet: Flag = False
    dashboard: Flag = False
    mlflow: str | None = Field(None, description="also log the rows to this MLflow tracking URI (a server,"
                               " sqlite:///mlflow.db, or a file: store)")
    nsys: Flag = Field(False, description="run each worker under Nsight Systems; reports in runs/<name>/profile/")
    verbose: Flag = Field(False, description="stream Ray's own lines and every rank's log to the terminal (default:"
                          " the bar, a line per validation, warnings and errors; the rest is in logs/)")

    # Fields are validated in order, so a rule on a later field sees the earlier ones in `info.data`.

    @model_validator(mode="before")
    @classmethod
    def _worker_range(cls, data: Any) -> Any:
        if isinstance(data, dict) and "workers" in data:
            return {**data, **worker_range(data["workers"])}
        return data

    @field_validator("workers")
    @classmethod
    def _dp_is_one_worker(cls, workers: int, info: ValidationInfo) -> int:
        train = info.data.get("train")
        if train is not None and train.strategy == "dp" and workers > 1:
            raise ValueError(f"strategy dp runs in one worker, not {workers}: use ddp across workers")
        return workers

    @field_validator("min_workers")
    @classmethod
    def _elastic(cls, least: int | None, info: ValidationInfo) -> int | None:
        most, train = info.data.get("workers"), info.data.get("train")
        if least is None or most is None:
            return least
        if least > most:
            raise ValueError(f"{least} exceeds workers ({most}): give workers MIN..MAX with MIN <= MAX")
        if train is not None and train.strategy not in ("ddp", "fsdp"):
            raise ValueError(f"elastic workers ({least}..{most}) need strategy ddp or fsdp (it is {train.strategy}):"
                             " its mesh or stages are fixed to a worker count")
        return None if least == most else least

    @field_validator("gpus_per_worker")
    @classmethod
    def _gpu_shares(cls, gpus: float, info: ValidationInfo) -> float:
        if gpus > 1 and gpus != int(gpus):
            raise ValueError(f"gpus_per_worker={gpus:g}: above 1 it must be a whole number")
        workers = info.data.get("workers", 1)
        if 0 < gpus < 1 and workers > 1:
            raise ValueError(f"gpus_per_worker={gpus:g} shares a GPU, which only a 1-worker job may do (NCCL"
                             f" refuses two ranks on one GPU): workers is {workers}")
        return gpus

    @field_validator("user")
    @classmethod
    def _finite_user_numbers(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key, setting in value.items():
            if isinstance(setting, float) and not math.isfinite(setting):
                raise ValueError(f"user.{key}: {setting} is not a finite number")
        return value

    @field_validator("address")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        return value if value is None else check_address(value)

    @field_validator("script", "module")
    @classmethod
    def _one_way_in(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return value
        others = [k for k in ("entry", "script") if info.data.get(k) and k != info.field_name]
        if others:
            raise ValueError(f"give one of entry, script and module, not {info.field_name} and {others[0]}")
        if info.field_name == "script" and not Path(value).is_file():
            raise ValueError(f"{value}: no such script: give the path of a Python file")
        if info.field_name == "module" and not re.match(r"^[A-Za-z_][\w.]*$", value):
            raise ValueError(f"{value!r} is not a module name (e.g. mypkg.train)")
        return value

    @field_validator("datasets")
    @classmethod
    def _datasets_feed_a_function(cls, datasets: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        if datasets and not info.data.get("entry"):
            raise ValueError("Ray Data datasets feed an `entry` function (ray.train.get_dataset_shard); the shared"
                             " loop reads its own: use --dataset parquet --data-path FILE for it")
        for name, path in datasets.items():
            if not Path(path).exists() and "://" not in path:
                raise ValueError(f"{name}: {path}: no such file or folder")
        return datasets

    @field_validator("name")
    @classmethod
    def _name(cls, name: str | None) -> str | None:
        if name is not None and not RUN_NAME.match(name):
            raise ValueError(f"{name!r} is not a run name: use letters, digits, '.', '_' or '-' (<= 100 chars)")
        return name

    @field_validator("entry")
    @classmethod
    def _entry(cls, entry: str | None) -> str | None:
        if entry is not None and not re.match(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", entry):
            raise ValueError(f"{entry!r} is not module:function (e.g. mypkg.train:train_func)")
        return entry

    @property
    def kind(self) -> str:
        """What the job runs: "loop" (the shared loop), "function" (entry) or "script" (script/module)."""
        return "script" if self.script or self.module else "function" if self.entry else "loop"

    @property
    def program(self) -> str:
        """What runs, in a word fit for a folder name: the script's file name, the module's or the entry's last
        part, or the model (its factory's name for an import path)."""
        what = (Path(self.script).stem if self.script else self.module.rsplit(".", 1)[-1] if self.module
                else (self.entry or self.train.model).rsplit(":", 1)[-1])
        return re.sub(r"[^A-Za-z0-9._-]+", "-", what)

    def job_request(self) -> JobRequest:
        """What this launch asks of the cluster, for cluster.plan."""
        return JobRequest(workers=self.workers, gpus_per_worker=self.gpus_per_worker,
                          cpus_per_worker=self.cpus_per_worker, placement=self.placement, node_group=self.node_group,
                          hsdp=self.train.strategy == "hsdp", shard_size=self.train.shard_size)

    def saved_form(self) -> dict:
        """What launch.yaml holds: everything but the per-invocation display flags."""
        return self.model_dump(mode="json", exclude={"quiet", "dashboard", "verbose"})


def load_launch_config(path: str | Path) -> LaunchConfig:
    return validate_doc(LaunchConfig, read_yaml(path))


def write_launch_config(cfg: LaunchConfig, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(cfg.saved_form(), sort_keys=False))
    tmp.replace(path)  # atomic: a reader never sees half a file


def split_overrides(flat: dict[str, Any]) -> dict[str, Any]:
    """Route flat settings (Python keywords, a sweep's sampled values) to TrainConfig or LaunchConfig fields,
    or `user.NAME` to the user's own settings; unknown ones are errors. (`user={...}` sets them all.)"""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        if key.startswith(USER_PREFIX) and len(key) > len(USER_PREFIX):
            out.setdefault("user", {})[key[len(USER_PREFIX):]] = value
        elif key in TrainConfig.model_fields:
            out.setdefault("train", {})[key] = value
        elif key in LaunchConfig.model_fields and key != "train":
            out[key] = value
        else:
            raise ConfigError(f"unknown setting {key!r}: see `orchestrator launch --help` for the settings")
    return out


def merge(base: LaunchConfig, overrides: dict[str, Any]) -> LaunchConfig:
    """`base` with nested `overrides` ({"train": {...}, "workers": ...}) on top, validated as a whole."""
    data = base.model_dump()
    data.update({k: v for k, v in overrides.items() if k not in ("train", "user")})
    for nested in ("train", "user"):  # merged key by key: a flag or a sampled value changes one setting
        data[nested] = {**data[nested], **overrides.get(nested, {})}
    return LaunchConfig.model_validate(data)


def leaving_out_idle(base: LaunchConfig, overrides: dict[str, Any], keep_given: bool) -> dict[str, Any]:
    """`overrides` with, for each train setting that would do nothing under them (see ACTS_ONLY_WITH), its
    default: a resumed run moved from fsdp to ddp leaves its fsdp-only settings behind, a sweep's trial those
    its sampled values make idle. `keep_given`: what the overrides set themselves stays (and is refused)."""
    given, defaults = overrides.get("train", {}), {}
    while True:  # to a fixed point: checkpoint_format left behind leaves checkpoint_async idle in turn
        idle = idle_settings({**base.train.model_dump(), **given, **defaults})
        more = {name: TrainConfig.model_fields[name].default for name in idle
                if not (keep_given and name in given) and name not in defaults}
        if not more:
            return {**overrides, "train": {**given, **defaults}} if defaults else overrides
        defaults |= more


def run_folder(name: str, spec_path: str | None) -> RunPlace:
    """Where run `name` lives: under the storage path of the cluster spec (default: this machine's)."""
    return RunPlace.of(resolve_storage(load_spec(spec_path)), name)


def saved_launch_config(place: RunPlace) -> LaunchConfig:
    """The launch.yaml of the run at `place` (read through a temporary copy where it is on a URI)."""
    if place.uri is None:
        return load_launch_config(place.local / LAUNCH_FILE)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / LAUNCH_FILE
        copy.write_bytes(place.read(LAUNCH_FILE))
        return load_launch_config(copy)


def resolve_launch(overrides: dict[str, Any], config_file: str | None = None,
                   resume: str | None = None) -> LaunchConfig:
    """The launch config from nested overrides on top of a config file, of the launch.yaml of the run being
    resumed, or of the defaults. Any problem is one ConfigError line."""
    try:
        if resume:
            place = run_folder(resume, overrides.get("cluster"))
            if not place.has(LAUNCH_FILE):
                raise ConfigError(f"--resume {resume}: no run at {place.where}")
            saved = saved_launch_config(place)
            return merge(saved, leaving_out_idle(saved, {**overrides, "name": resume}, keep_given=True))
        base = load_launch_config(config_file) if config_file else LaunchConfig()
        return merge(base, overrides)
    except ValidationError as exc:
        raise ConfigError(validation_message(exc, None, "settings")) from None
