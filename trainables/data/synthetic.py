"""Synthetic data for speed tests: torchvision FakeData for images, seeded random tokens for language models."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset
from torchvision.datasets import FakeData
from torchvision.transforms import v2

from trainables.config import TrainConfig
from trainables.data.meta import DataMeta
from trainables.data.text import TokenWindows

FAKE_CLASSES = 1000
GPT2_VOCAB = 50304  # GPT-2's 50,257 padded to a multiple of 64, as nanoGPT does


def fake_images(cfg: TrainConfig) -> tuple[Dataset, Dataset, DataMeta]:
    size = (3, cfg.image_size, cfg.image_size)
    to_tensor = v2.Compose([v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True)])
    n_val = max(1, round(cfg.fake_samples * cfg.val_fraction))
    train = FakeData(cfg.fake_samples, size, FAKE_CLASSES, transform=to_tensor, random_offset=0)
    val = FakeData(n_val, size, FAKE_CLASSES, transform=to_tensor, random_offset=cfg.fake_samples)
    meta = DataMeta(kind="image", num_classes=FAKE_CLASSES, in_channels=3, image_size=cfg.image_size)
    return train, val, meta


def fake_tokens(cfg: TrainConfig) -> tuple[Dataset, Dataset, DataMeta]:
    n_tokens = cfg.fake_samples * cfg.seq_len + 1
    tokens = torch.randint(0, GPT2_VOCAB, (n_tokens,), generator=torch.Generator().manual_seed(0))
    cut = int(n_tokens * (1 - cfg.val_fraction))
    meta = DataMeta(kind="tokens", num_classes=GPT2_VOCAB, seq_len=cfg.seq_len)
    return TokenWindows(tokens[:cut], cfg.seq_len), TokenWindows(tokens[cut:], cfg.seq_len), meta
