"""A real character-level corpus every machine has: the Python standard library's own source, as bytes."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from trainables.config import TrainConfig
from trainables.data.meta import DataMeta
from trainables.data.shipped import stdlib_corpus, token_cut, windows


class TokenWindows(Dataset):
    """Non-overlapping windows of seq_len+1 tokens; sample i is (window[:-1], window[1:])."""

    def __init__(self, tokens: torch.Tensor, seq_len: int) -> None:
        self.tokens = tokens
        self.seq_len = seq_len

    def __len__(self) -> int:
        return windows(len(self.tokens), self.seq_len)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        window = self.tokens[i * self.seq_len : (i + 1) * self.seq_len + 1]
        return window[:-1], window[1:]


def stdlib_text(cfg: TrainConfig) -> tuple[Dataset, Dataset, DataMeta]:
    tokens = torch.frombuffer(bytearray(stdlib_corpus()), dtype=torch.uint8).long()
    cut = token_cut(len(tokens), cfg.val_fraction)
    meta = DataMeta(kind="tokens", num_classes=256, seq_len=cfg.seq_len)
    return TokenWindows(tokens[:cut], cfg.seq_len), TokenWindows(tokens[cut:], cfg.seq_len), meta
