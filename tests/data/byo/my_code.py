"""A user's own code, outside the package, as `--model my_code:... --dataset my_code:...` finds it (tests copy
this file into the folder they launch from): a model and data by import path, and a model that computes its
own loss from dict batches, as Hugging Face models do."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from trainables.data.digits import digits_tensors
from trainables.data.split import split_indices


def _flat_digits() -> tuple[torch.Tensor, torch.Tensor, list[int], list[int]]:
    images, labels = digits_tensors()
    train_idx, val_idx = split_indices(len(labels), 0.2)
    return images.flatten(1), labels, train_idx, val_idx  # (N, 64) in [0, 1], (N,)


def digits_flat(cfg) -> tuple[Dataset, Dataset]:
    """(x, y) pairs of 64 pixels and a label; no DataMeta: the model is told its sizes by the user."""
    x, y, train_idx, val_idx = _flat_digits()
    return TensorDataset(x[train_idx], y[train_idx]), TensorDataset(x[val_idx], y[val_idx])


def mlp(hidden: int = 32, classes: int = 10) -> nn.Module:
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, classes))


class DictDigits(Dataset):
    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"pixels": self.x[i], "labels": self.y[i]}


def dict_digits(cfg) -> tuple[Dataset, Dataset]:
    x, y, train_idx, val_idx = _flat_digits()
    return DictDigits(x[train_idx], y[train_idx]), DictDigits(x[val_idx], y[val_idx])


class ScoringMLP(nn.Module):
    """forward(pixels, labels) -> {"loss", "logits"}: the model computes its own loss."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.net = mlp(hidden)

    def forward(self, pixels: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        logits = self.net(pixels)
        return {"loss": F.cross_entropy(logits, labels), "logits": logits}


def scoring_mlp(hidden: int = 32) -> nn.Module:
    return ScoringMLP(hidden)


def needs_width(width: int) -> nn.Module:  # a required argument the user must set
    return mlp(width)


def not_a_model(meta) -> str:
    return "a string"
