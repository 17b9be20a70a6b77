"""Datasets by name, or a user's own by import path (`package.module:factory`, see trainables.factories).
Each builder returns (train, val, meta); meta tells the model what it is fed. A user's factory returns
(train, val) or (train, val, DataMeta)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from groundwork.errors import ConfigError
from trainables.config import TrainConfig
from trainables.data.meta import DataMeta
from trainables.factories import call, is_import_path, resolve

if TYPE_CHECKING:
    from torch.utils.data import Dataset

# Each builder's import path, imported when a run builds its data: the driver, which only checks the data
# (trainables.data.check), imports no torch.
DATASETS: dict[str, str] = {
    "digits": "trainables.data.digits:digits",
    "stdlib-text": "trainables.data.text:stdlib_text",
    "fake-images": "trainables.data.synthetic:fake_images",
    "fake-tokens": "trainables.data.synthetic:fake_tokens",
    "parquet": "trainables.data.parquet:parquet",
}
# What each dataset feeds, known before any data is read (parquet's depends on its columns).
DATASET_KINDS: dict[str, str] = {"digits": "image", "stdlib-text": "tokens", "fake-images": "image",
                                 "fake-tokens": "tokens"}


def build_datasets(cfg: TrainConfig, name: str,
                   user: Mapping[str, Any] | None = None) -> tuple[Dataset, Dataset, DataMeta]:
    if is_import_path(name):
        return users_datasets(call(resolve(name, "dataset"), name, "dataset", {"cfg": cfg}, user or {}), name)
    if name not in DATASETS:
        raise ConfigError(f"dataset {name!r} is unknown: choose one of {sorted(DATASETS)}")
    return resolve(DATASETS[name], "dataset")(cfg)


def users_datasets(out: Any, name: str) -> tuple[Dataset, Dataset, DataMeta]:
    if isinstance(out, tuple | list) and len(out) in (2, 3) and (len(out) == 2 or isinstance(out[2], DataMeta)):
        meta = out[2] if len(out) == 3 else DataMeta(kind="custom", num_classes=0)
        return out[0], out[1], meta
    raise ConfigError(f"dataset {name!r} returned a {type(out).__name__}: a dataset factory returns (train, val)"
                      " or (train, val, DataMeta)")


__all__ = ["DATASETS", "DATASET_KINDS", "DataMeta", "build_datasets"]
