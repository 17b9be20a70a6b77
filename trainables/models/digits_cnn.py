"""A small CNN for 8x8 digits: two convs and two linear layers, no BatchNorm or dropout, so a DDP run and
a single-process run on the same global batch compute the same weights."""

from __future__ import annotations

import torch
from torch import nn


class DigitsCNN(nn.Module):
    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 8) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),  # (B, 64, S/2, S/2)
        )
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(64 * (image_size // 2) ** 2, 128), nn.ReLU(), nn.Linear(128, num_classes)
        )

    def pipeline_layers(self) -> list[nn.Module]:
        return [*self.features, *self.head]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, S, S) -> (B, classes)
        return self.head(self.features(x))
