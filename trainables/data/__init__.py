"""Datasets by name. Each builder returns (train, val, meta); meta tells the model what it is fed."""

from __future__ import annotations

from collections.abc import Callable

from torch.utils.data import Dataset

from groundwork.errors import ConfigError
from trainables.config import TrainConfig
from trainables.data.digits import digits
from trainables.data.meta import DataMeta
from trainables.data.parquet import parquet
from trainables.data.synthetic import fake_images, fake_tokens
from trainables.data.text import stdlib_text

Builder = Callable[[TrainConfig], tuple[Dataset, Dataset, DataMeta]]
DATASETS: dict[str, Builder] = {
    "digits": digits,
    "stdlib-text": stdlib_text,
    "fake-images": fake_images,
    "fake-tokens": fake_tokens,
    "parquet": parquet,
}
# What each dataset feeds, known before any data is read (parquet's depends on its columns).
DATASET_KINDS: dict[str, str] = {"digits": "image", "stdlib-text": "tokens", "fake-images": "image",
                                 "fake-tokens": "tokens"}


def build_datasets(cfg: TrainConfig, name: str) -> tuple[Dataset, Dataset, DataMeta]:
    if name not in DATASETS:
        raise ConfigError(f"dataset {name!r} is unknown: choose one of {sorted(DATASETS)}")
    return DATASETS[name](cfg)


__all__ = ["DATASETS", "DATASET_KINDS", "DataMeta", "build_datasets"]
