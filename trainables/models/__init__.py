"""Models by name. A builder takes the dataset's meta, so one model name works with several datasets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from groundwork.errors import ConfigError
from trainables.data.meta import DataMeta
from trainables.models.digits_cnn import DigitsCNN
from trainables.models.gpt import GPT, GPTConfig
from trainables.models.vision import resnet


@dataclass(frozen=True)
class ModelEntry:
    build: Callable[[DataMeta], nn.Module]
    kind: str  # the DataMeta.kind it consumes
    default_dataset: str


def _gpt(n_layer: int, n_head: int, n_embd: int) -> Callable[[DataMeta], nn.Module]:
    def build(meta: DataMeta) -> nn.Module:
        cfg = GPTConfig(vocab_size=meta.num_classes, block_size=meta.seq_len, n_layer=n_layer,
                        n_head=n_head, n_embd=n_embd)
        return GPT(cfg)
    return build


MODELS: dict[str, ModelEntry] = {
    "digits-cnn": ModelEntry(lambda m: DigitsCNN(m.in_channels, m.num_classes, m.image_size), "image", "digits"),
    "resnet18": ModelEntry(lambda m: resnet(18, m.in_channels, m.num_classes), "image", "fake-images"),
    "resnet50": ModelEntry(lambda m: resnet(50, m.in_channels, m.num_classes), "image", "fake-images"),
    "gpt-char": ModelEntry(_gpt(4, 4, 128), "tokens", "stdlib-text"),
    "gpt2-124m": ModelEntry(_gpt(12, 12, 768), "tokens", "fake-tokens"),
}


def model_entry(name: str) -> ModelEntry:
    if name not in MODELS:
        raise ConfigError(f"model {name!r} is unknown: choose one of {sorted(MODELS)}")
    return MODELS[name]


def check_pairing(name: str, data_kind: str) -> ModelEntry:
    entry = model_entry(name)
    if entry.kind != data_kind:
        raise ConfigError(f"model {name!r} takes {entry.kind} data but the dataset gives {data_kind}:"
                          f" pick a {entry.kind} dataset (default: {entry.default_dataset})")
    return entry


def build_model(name: str, meta: DataMeta) -> nn.Module:
    return check_pairing(name, meta.kind).build(meta)
