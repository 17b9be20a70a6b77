from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class DataMeta:
    """What a model needs to know about its inputs. The built-in datasets yield (inputs, targets) pairs and
    the loss is cross-entropy over the last dimension: classes for images, the vocabulary for tokens. A user's
    dataset that returns no meta is "custom" (num_classes 0: unknown), which only a user's model takes."""

    kind: Literal["image", "tokens", "custom"]
    num_classes: int  # classes, or vocabulary size
    in_channels: int = 0
    image_size: int = 0
    seq_len: int = 0
