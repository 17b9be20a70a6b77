"""The checks of a run's settings that need no data loaded and no torch: the driver runs them before any
worker starts (and before it would pay torch's import)."""

from __future__ import annotations

from pathlib import Path

from groundwork.errors import ConfigError
from trainables.config import TrainConfig
from trainables.data import DATASET_KINDS, DATASETS
from trainables.factories import is_import_path, resolve
from trainables.models import check_pairing, model_entry


def dataset_of(cfg: TrainConfig) -> str:
    """The dataset to train on: the one asked for, else the built-in model's own."""
    if cfg.dataset:
        return cfg.dataset
    if is_import_path(cfg.model):
        raise ConfigError(f"model {cfg.model!r} is your own: name its data with --dataset (a built-in name or"
                          " package.module:factory)")
    return model_entry(cfg.model).default_dataset


def check_config(cfg: TrainConfig) -> None:
    """The checks that need no data loaded, run by the driver before any worker starts."""
    if not is_import_path(cfg.model):
        model_entry(cfg.model)  # a built-in name: one we know
    name = dataset_of(cfg)
    for path, what in ((cfg.model, "model"), (name, "dataset"), (cfg.loss, "loss")):
        if path and is_import_path(path):
            resolve(path, what)  # importable and callable, here rather than in every worker
    if not is_import_path(cfg.model) and name in DATASET_KINDS:
        check_pairing(cfg.model, DATASET_KINDS[name])
    if not is_import_path(name) and name not in DATASETS:
        raise ConfigError(f"dataset {name!r} is unknown: choose one of {sorted(DATASETS)} or give"
                          " package.module:factory")
    if cfg.data_path and not Path(cfg.data_path).exists():
        raise ConfigError(f"data_path {cfg.data_path}: no such file or folder")
