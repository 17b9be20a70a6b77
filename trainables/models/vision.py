"""torchvision classifiers, adapted to the dataset's channels (e.g. 1-channel images) when needed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

if TYPE_CHECKING:
    import torchvision


def resnet(depth: int, in_channels: int, num_classes: int) -> nn.Module:
    import torchvision  # here, not at the top: importing it costs every worker ~1 s, and most jobs never need it

    model = getattr(torchvision.models, f"resnet{depth}")(weights=None, num_classes=num_classes)
    if in_channels != 3:
        model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return model


def resnet_layers(model: torchvision.models.ResNet) -> list[nn.Module]:
    """A torchvision ResNet as a sequence: stem, the four stages' blocks, then pooling and the classifier."""
    stem = nn.Sequential(model.conv1, model.bn1, model.relu, model.maxpool)
    blocks = [block for stage in (model.layer1, model.layer2, model.layer3, model.layer4) for block in stage]
    return [stem, *blocks, nn.Sequential(model.avgpool, nn.Flatten(1), model.fc)]
