"""Models by name, or a user's own by import path (`package.module:factory`, see trainables.factories). A
built-in builder takes the dataset's meta, so one model name works with several datasets."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from groundwork.errors import ConfigError
from trainables.config import TrainConfig
from trainables.data.meta import DataMeta
from trainables.factories import call, is_import_path, resolve
from trainables.models.shapes import LLAMA_SIZES

if TYPE_CHECKING:
    from torch import nn

# The builders import their model's module (and torch) when called: the driver, which only checks a run's
# model name and its pairing with the data, imports no torch.


@dataclass(frozen=True)
class ModelEntry:
    build: Callable[[DataMeta], nn.Module]
    kind: str  # the DataMeta.kind it consumes
    default_dataset: str


def _gpt(n_layer: int, n_head: int, n_embd: int) -> Callable[[DataMeta], nn.Module]:
    def build(meta: DataMeta) -> nn.Module:
        from trainables.models.gpt import GPT, GPTConfig  # when built: see MODELS

        return GPT(GPTConfig(vocab_size=meta.num_classes, block_size=meta.seq_len, n_layer=n_layer,
                             n_head=n_head, n_embd=n_embd))
    return build


def _digits_cnn(meta: DataMeta) -> nn.Module:
    from trainables.models.digits_cnn import DigitsCNN  # when built: see MODELS

    return DigitsCNN(meta.in_channels, meta.num_classes, meta.image_size)


def _resnet(depth: int) -> Callable[[DataMeta], nn.Module]:
    def build(meta: DataMeta) -> nn.Module:
        from trainables.models.vision import resnet  # when built: see MODELS

        return resnet(depth, meta.in_channels, meta.num_classes)
    return build


def _llama(size: str) -> Callable[[DataMeta], nn.Module]:
    def build(meta: DataMeta) -> nn.Module:
        from trainables.models.llama import llama  # when built: see MODELS

        return llama(size, meta.num_classes, meta.seq_len)
    return build


MODELS: dict[str, ModelEntry] = {
    "digits-cnn": ModelEntry(_digits_cnn, "image", "digits"),
    "resnet18": ModelEntry(_resnet(18), "image", "fake-images"),
    "resnet50": ModelEntry(_resnet(50), "image", "fake-images"),
    "gpt-char": ModelEntry(_gpt(4, 4, 128), "tokens", "stdlib-text"),
    "gpt2-124m": ModelEntry(_gpt(12, 12, 768), "tokens", "fake-tokens"),
    "gpt-1.3b": ModelEntry(_gpt(24, 16, 2048), "tokens", "fake-tokens"),  # GPT-3 XL's shape (1024 tokens here)
    **{size: ModelEntry(_llama(size), "tokens", "stdlib-text" if size == "llama-toy" else "fake-tokens")
       for size in LLAMA_SIZES},
}


def model_entry(name: str) -> ModelEntry:
    if name not in MODELS:
        raise ConfigError(f"model {name!r} is unknown: choose one of {sorted(MODELS)}")
    return MODELS[name]


def check_pairing(name: str, data_kind: str) -> ModelEntry:
    entry = model_entry(name)
    if entry.kind != data_kind:
        raise ConfigError(f"model {name!r} takes {entry.kind} data but the dataset gives {data_kind}:"
                          f" pick a dataset that gives {entry.kind} (default: {entry.default_dataset})")
    return entry


def build_model(name: str, meta: DataMeta, cfg: TrainConfig | None = None,
                user: Mapping[str, Any] | None = None) -> nn.Module:
    if not is_import_path(name):
        return check_pairing(name, meta.kind).build(meta)
    offered: dict[str, Any] = {"meta": meta, "cfg": cfg or TrainConfig()}
    if meta.num_classes:
        offered["num_classes"] = meta.num_classes
    from torch import nn  # here: the driver's checks import no torch (see MODELS)

    model = call(resolve(name, "model"), name, "model", offered, user or {})
    if not isinstance(model, nn.Module):
        raise ConfigError(f"model {name!r} returned a {type(model).__name__}: a model factory returns a"
                          " torch.nn.Module")
    return model
