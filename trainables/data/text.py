"""A real character-level corpus every machine has: the Python standard library's own source, as bytes."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import torch
from torch.utils.data import Dataset

from trainables.config import TrainConfig
from trainables.data.meta import DataMeta

CORPUS_BYTES = 4 * 2**20  # 4 MiB: enough for a char model to learn, small enough to read in well under 1 s


def stdlib_corpus(max_bytes: int = CORPUS_BYTES) -> bytes:
    """The first max_bytes of the stdlib's .py files in sorted order: the same bytes on every run."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(root.glob("*.py")) + sorted(root.glob("*/*.py")):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    return b"".join(chunks)[:max_bytes]


class TokenWindows(Dataset):
    """Non-overlapping windows of seq_len+1 tokens; sample i is (window[:-1], window[1:])."""

    def __init__(self, tokens: torch.Tensor, seq_len: int) -> None:
        self.tokens = tokens
        self.seq_len = seq_len

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.seq_len

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        window = self.tokens[i * self.seq_len : (i + 1) * self.seq_len + 1]
        return window[:-1], window[1:]


def stdlib_text(cfg: TrainConfig) -> tuple[Dataset, Dataset, DataMeta]:
    tokens = torch.frombuffer(bytearray(stdlib_corpus()), dtype=torch.uint8).long()
    cut = int(len(tokens) * (1 - cfg.val_fraction))  # contiguous split: val text never seen in training
    meta = DataMeta(kind="tokens", num_classes=256, seq_len=cfg.seq_len)
    return TokenWindows(tokens[:cut], cfg.seq_len), TokenWindows(tokens[cut:], cfg.seq_len), meta
