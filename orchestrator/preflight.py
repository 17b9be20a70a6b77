"""Everything a launch, a sweep or a pool can be refused for without a cluster: the spec loads, the plan fits
it, the model and dataset go together, the entry function imports. Run on the driver before Ray starts and
before anything is written; each refusal is one ConfigError line."""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
from pathlib import Path

import pyarrow.fs as pafs

from cluster.plan import Plan, plan
from cluster.spec import ClusterSpec, load_spec
from groundwork.address import wait_reachable
from groundwork.errors import ConfigError
from groundwork.localray import standing_address
from groundwork.remote import is_uri, open_uri, probe
from orchestrator.config import LaunchConfig
from orchestrator.raytrain.job import resolve_entry, takes_config
from trainables.checks import check_config, dataset_of
from trainables.data.check import check_data

log = logging.getLogger(__name__)


def check_entry(entry: str) -> None:
    """The function imports, and takes one argument (the config dict) or none, as TorchTrainer allows."""
    try:
        fn = resolve_entry(entry)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"entry {entry!r} cannot be loaded ({exc}): check the module is importable") from None
    if takes_config(fn) is None:
        raise ConfigError(f"entry {entry!r} cannot be called as train_func(config) or train_func(): a train"
                          " function takes one argument (its config dict) or none")


def check_script(cfg: LaunchConfig) -> None:
    """The script compiles, or the module can be found, here rather than in every rank after Ray's start."""
    if cfg.script:
        try:
            compile(Path(cfg.script).read_bytes(), cfg.script, "exec")
        except (SyntaxError, ValueError) as exc:
            line = f":{exc.lineno}" if getattr(exc, "lineno", None) else ""
            raise ConfigError(f"script {cfg.script}{line}: it does not compile ({type(exc).__name__}:"
                              f" {getattr(exc, 'msg', exc)}): fix it, then launch") from None
    elif cfg.module:
        try:
            found = importlib.util.find_spec(cfg.module)
        except (ImportError, ValueError) as exc:
            found, why = None, f" ({exc})"
        else:
            why = ""
        if found is None:
            raise ConfigError(f"module {cfg.module}: not found from {Path.cwd()}{why}: run from the folder that"
                              " holds its package, or install it")


MIN_FREE_BYTES = 1 << 20  # less is a full disk: the first log line would fail


def check_storage(storage_path: str) -> None:
    """The run folders' storage can be written and has room, before anything is written there. A URI: pyarrow
    opens it and can look at it (a bucket's permission to write shows only when written to)."""
    if is_uri(storage_path):
        try:
            fs, path = open_uri(storage_path)
            if isinstance(fs, pafs.LocalFileSystem):  # file://: the same checks as a plain folder
                return check_storage(path)
            if fs.get_file_info(path).type == pafs.FileType.File:
                raise ConfigError(f"storage {storage_path}: a file, not a folder: set storage.path to a folder")
            probe(storage_path)  # a bucket's permission to write shows only when written to
        except OSError as exc:
            why = str(exc).splitlines()[0]
            raise ConfigError(f"storage {storage_path}: cannot be written ({why}): check the credentials and the"
                              " address, or set storage.path in the cluster spec elsewhere") from None
        return
    existing = Path(storage_path).absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"storage {storage_path}: {existing} cannot be written: set storage.path in the"
                          " cluster spec to a folder you can write, or fix its permissions")
    free = shutil.disk_usage(existing).free
    if free < MIN_FREE_BYTES:
        raise ConfigError(f"storage {storage_path}: only {free >> 20} MiB free on its file system: free some,"
                          " or set storage.path in the cluster spec elsewhere")


def check_fp8(cfg: LaunchConfig, the_plan: Plan) -> None:
    """fp8 runs on GPU workers with torchao; the GPU's own capability is checked on the worker (Ada/Hopper)."""
    if cfg.kind != "loop":
        raise ConfigError(f"precision fp8 converts the shared loop's model: a {cfg.kind} launch does its own"
                          " precision")
    if not the_plan.use_gpu:
        raise ConfigError("precision fp8 needs NVIDIA GPUs with float8 (compute capability 8.9+: Ada, Hopper):"
                          " these workers have none: add --gpus-per-worker 1, or use --precision bf16")
    if importlib.util.find_spec("torchao") is None:
        raise ConfigError("precision fp8 needs torchao (PyTorch's float8 training): pip install torchao")


def standing_ray(spec: ClusterSpec) -> str | None:
    """The local Ray of `orchestrator up`, if one runs with this spec: a launch with no address runs there."""
    address = standing_address(spec.name) if spec.num_nodes == 1 else None
    if address is not None:
        log.info("on the local Ray of `orchestrator up` at %s (`orchestrator down` ends it)", address)
    return address


def checked_plan(cfg: LaunchConfig) -> tuple[ClusterSpec, Plan, str | None]:
    """Spec, plan and Ray address for a launch, after every check that needs no cluster."""
    spec = load_spec(cfg.cluster)
    the_plan = plan(spec, cfg.job_request())
    check_config(cfg.train)
    check_storage(the_plan.storage_path)
    if cfg.train.cpu_offload and not the_plan.use_gpu:
        raise ConfigError("cpu_offload keeps what FSDP holds in CPU memory rather than the GPU's: these workers have"
                          " no GPU: add --gpus-per-worker 1, or drop --cpu-offload")
    if is_uri(the_plan.storage_path) and cfg.train.checkpoint_format == "sharded":
        raise ConfigError(f"checkpoint_format sharded has every rank write into one folder that all of them see:"
                          f" storage {the_plan.storage_path} is a URI: use checkpoint_format full, or a shared"
                          " filesystem path")
    if cfg.entry:
        check_entry(cfg.entry)
    if cfg.kind == "loop":
        check_data(cfg.train, dataset_of(cfg.train), cfg.workers, cfg.user)
    if cfg.kind == "script":
        check_script(cfg)
    if cfg.nsys and shutil.which("nsys") is None:
        raise ConfigError("--nsys: Nsight Systems (`nsys`) is not on PATH here: install it (NVIDIA's CUDA toolkit"
                          " or the nsight-systems package) on every node, or drop --nsys")
    if cfg.train.precision == "fp8":
        check_fp8(cfg, the_plan)
    if cfg.mlflow and importlib.util.find_spec("mlflow") is None:
        raise ConfigError(f"--mlflow {cfg.mlflow}: MLflow is not installed: pip install mlflow-skinny")
    address = cfg.address or spec.address or standing_ray(spec)
    if address is None and spec.num_nodes > 1:
        raise ConfigError(f"the cluster spec describes {spec.num_nodes} nodes but no Ray address is given:"
                          " pass --address or set address: in the spec")
    if address is not None:
        wait_reachable(address, cfg.connect_timeout)
    return spec, the_plan, address
