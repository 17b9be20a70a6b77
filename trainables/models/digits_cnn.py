"""A small CNN for 8x8 digits: two convs and two linear layers, no BatchNorm or dropout, so a DDP run and
a single-process run on the same global batch compute the same weights."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MaxPool2x2(nn.Module):
    """2x2 max pooling; on CPU over a channels-last copy: PyTorch's CPU kernel for the default layout takes
    ~20x longer at this size (32x64x8x8: 0.92 ms vs 0.04 ms on one core, ~40% of a validation batch), and the
    maximum is the same whatever the layout."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu":
            x = x.contiguous(memory_format=torch.channels_last)
        return F.max_pool2d(x, 2)


class DigitsCNN(nn.Module):
    def __init__(self, in_channels: int = 1, num_classes: int = 10, image_size: int = 8) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=1), nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
            MaxPool2x2(),  # (B, 64, S/2, S/2)
        )
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(64 * (image_size // 2) ** 2, 128), nn.ReLU(), nn.Linear(128, num_classes)
        )

    def pipeline_layers(self) -> list[nn.Module]:
        return [*self.features, *self.head]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, S, S) -> (B, classes)
        return self.head(self.features(x))
