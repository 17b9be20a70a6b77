"""Synthetic data for speed tests: seeded random images and tokens, cheap enough to read that a benchmark
measures the model and not the data (torchvision's FakeData renders every image through PIL, ~1 ms at 224
px: 16 loader processes could not keep one H200 busy with ResNet-50)."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from trainables.config import TrainConfig
from trainables.data.meta import DataMeta
from trainables.data.shipped import fake_token_split, held_out
from trainables.data.text import TokenWindows

FAKE_CLASSES = 1000
GPT2_VOCAB = 50304  # GPT-2's 50,257 padded to a multiple of 64, as nanoGPT does


class RandomImages(Dataset):
    """`n` labelled images drawn from a pool of `pool` distinct seeded random ones. Yielded as uint8, like
    decoded files: the loop scales them to [0, 1] on the device (a quarter of the bytes to copy)."""

    def __init__(self, n: int, size: tuple[int, int, int], classes: int, seed: int, pool: int = 64) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.pool = torch.randint(0, 256, (min(n, pool), *size), dtype=torch.uint8, generator=gen)
        self.labels = torch.randint(0, classes, (n,), generator=gen)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pool[i % len(self.pool)], self.labels[i]


def fake_images(cfg: TrainConfig) -> tuple[Dataset, Dataset, DataMeta]:
    size = (3, cfg.image_size, cfg.image_size)
    n_val = held_out(cfg.fake_samples, cfg.val_fraction)
    train = RandomImages(cfg.fake_samples, size, FAKE_CLASSES, seed=0)
    val = RandomImages(n_val, size, FAKE_CLASSES, seed=1)
    meta = DataMeta(kind="image", num_classes=FAKE_CLASSES, in_channels=3, image_size=cfg.image_size)
    return train, val, meta


def fake_tokens(cfg: TrainConfig) -> tuple[Dataset, Dataset, DataMeta]:
    n_tokens, cut = fake_token_split(cfg)
    tokens = torch.randint(0, GPT2_VOCAB, (n_tokens,), generator=torch.Generator().manual_seed(0))
    meta = DataMeta(kind="tokens", num_classes=GPT2_VOCAB, seq_len=cfg.seq_len)
    return TokenWindows(tokens[:cut], cfg.seq_len), TokenWindows(tokens[cut:], cfg.seq_len), meta
