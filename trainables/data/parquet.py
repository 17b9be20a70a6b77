"""A user's own data in Parquet (pyarrow): images with labels, or token sequences.

Columns:
- images: `image` (encoded PNG/JPEG bytes) and `label` (integer class);
- tokens: `tokens` (a list of ints per row, every row seq_len+1 long; sample = (row[:-1], row[1:])).
`data_path` is a .parquet file (split by val_fraction) or a folder holding train.parquet and val.parquet.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from PIL import Image
from torch.utils.data import Dataset, Subset

from groundwork.errors import ConfigError
from trainables.config import TrainConfig
from trainables.data.meta import DataMeta
from trainables.data.split import split_indices


class ParquetImages(Dataset):
    def __init__(self, table: pa.Table) -> None:
        self.images = table.column("image").combine_chunks()
        self.labels = torch.tensor(table.column("label").to_numpy(), dtype=torch.long)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        with Image.open(io.BytesIO(self.images[i].as_py())) as img:
            pixels = torch.from_numpy(np.array(img, dtype=np.uint8))  # (H, W) or (H, W, C)
        pixels = pixels.unsqueeze(0) if pixels.ndim == 2 else pixels.permute(2, 0, 1)
        return pixels, self.labels[i]  # uint8: the loop scales on the device


class ParquetTokens(Dataset):
    def __init__(self, table: pa.Table) -> None:
        rows = table.column("tokens").combine_chunks()
        lengths = set(rows.value_lengths().to_pylist())
        if len(lengths) != 1:
            raise ConfigError(f"parquet column tokens: rows have lengths {sorted(lengths)[:5]}: make every"
                              " row seq_len+1 tokens long")
        width = lengths.pop()
        self.tokens = torch.tensor(rows.flatten().to_numpy(), dtype=torch.long).view(-1, width)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.tokens[i, :-1], self.tokens[i, 1:]


def _read(path: Path) -> pa.Table:
    try:
        return pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise ConfigError(f"data_path {path}: not a readable parquet file ({exc})") from None


def _wrap(table: pa.Table, where: Path) -> Dataset:
    names = set(table.column_names)
    if {"image", "label"} <= names:
        return ParquetImages(table)
    if "tokens" in names:
        return ParquetTokens(table)
    raise ConfigError(f"data_path {where}: columns {sorted(names)}: need image+label or tokens")


def _meta(train: Dataset, table: pa.Table) -> DataMeta:
    base = train.dataset if isinstance(train, Subset) else train
    if isinstance(base, ParquetImages):
        first, _ = base[0]
        return DataMeta(kind="image", num_classes=int(base.labels.max()) + 1,
                        in_channels=first.shape[0], image_size=first.shape[-1])
    assert isinstance(base, ParquetTokens)
    return DataMeta(kind="tokens", num_classes=int(base.tokens.max()) + 1, seq_len=base.tokens.shape[1] - 1)


def parquet(cfg: TrainConfig) -> tuple[Dataset, Dataset, DataMeta]:
    path = Path(cfg.data_path or "")
    if path.is_dir():
        if not ((path / "train.parquet").is_file() and (path / "val.parquet").is_file()):
            raise ConfigError(f"data_path {path}: a folder must hold train.parquet and val.parquet")
        train_table = _read(path / "train.parquet")
        train, val = _wrap(train_table, path), _wrap(_read(path / "val.parquet"), path)
    elif path.is_file():
        train_table = _read(path)
        full = _wrap(train_table, path)
        train_idx, val_idx = split_indices(len(full), cfg.val_fraction)
        train, val = Subset(full, train_idx), Subset(full, val_idx)
    else:
        raise ConfigError(f"data_path {path}: no such file or folder: pass a .parquet file or a folder")
    return train, val, _meta(train, train_table)
