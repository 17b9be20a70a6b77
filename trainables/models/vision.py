"""torchvision classifiers, adapted to the dataset's channels (e.g. 1-channel images) when needed."""

from __future__ import annotations

import torchvision
from torch import nn


def resnet(depth: int, in_channels: int, num_classes: int) -> nn.Module:
    model = getattr(torchvision.models, f"resnet{depth}")(weights=None, num_classes=num_classes)
    if in_channels != 3:
        model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return model
