"""scikit-learn's 1,797 real 8x8 handwritten digits (UCI), shipped inside the package: no download."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset, Subset, TensorDataset

from trainables.config import TrainConfig
from trainables.data.meta import DataMeta
from trainables.data.split import split_indices


def digits_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0  # (N, 1, 8, 8) in [0, 1]
    return images, torch.tensor(bunch.target, dtype=torch.long)


def digits(cfg: TrainConfig) -> tuple[Dataset, Dataset, DataMeta]:
    images, labels = digits_tensors()
    full = TensorDataset(images, labels)
    train_idx, val_idx = split_indices(len(full), cfg.val_fraction)
    meta = DataMeta(kind="image", num_classes=10, in_channels=1, image_size=8)
    return Subset(full, train_idx), Subset(full, val_idx), meta
