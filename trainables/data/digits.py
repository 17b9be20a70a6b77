"""scikit-learn's 1,797 real 8x8 handwritten digits (UCI), shipped inside the package: no download."""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch.utils.data import Dataset, Subset, TensorDataset

from trainables.config import TrainConfig
from trainables.data.meta import DataMeta
from trainables.data.shipped import digits_csv
from trainables.data.split import split_indices


@functools.cache  # read once per process: a warm group's workers build it for every trial (~20 ms each)
def _digits_table() -> np.ndarray:
    table = np.loadtxt(digits_csv(), delimiter=",", dtype=np.float32)  # 64 pixels (0..16), then the label
    table.flags.writeable = False
    return table


def digits_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    """New tensors each call (a caller may change them in place), from the table read once."""
    table = _digits_table()
    images = torch.tensor(table[:, :64]).reshape(-1, 1, 8, 8) / 16.0  # (N, 1, 8, 8) in [0, 1]
    return images, torch.tensor(table[:, 64]).long()


def digits(cfg: TrainConfig) -> tuple[Dataset, Dataset, DataMeta]:
    images, labels = digits_tensors()
    full = TensorDataset(images, labels)
    train_idx, val_idx = split_indices(len(full), cfg.val_fraction)
    meta = DataMeta(kind="image", num_classes=10, in_channels=1, image_size=8)
    return Subset(full, train_idx), Subset(full, val_idx), meta
