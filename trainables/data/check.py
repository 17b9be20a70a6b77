"""The data a run asks for, checked on the driver before any worker starts: a file that cannot be read, has
the wrong columns or no rows, image bytes that do not decode, or fewer samples per worker than one optimizer
step needs (batch_size x grad_accum) are each refused in one line, where the workers would find them only
after Ray's start-up, with a traceback each.

The built-in datasets are counted, not built (trainables.data.shipped: no torch on the driver), and Parquet
read as far as its metadata and first rows. A user's own dataset factory is not called (it may be slow, or need
the workers' devices): its import path and signature are checked with the model's."""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from groundwork.errors import ConfigError
from trainables.config import TrainConfig
from trainables.data.shipped import builtin_sizes, held_out
from trainables.factories import is_import_path

SAMPLES_DECODED = 4  # per split: the first rows of each


def parquet_file(path: Path) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise ConfigError(f"data_path {path}: not a readable parquet file ({str(exc).splitlines()[0]}): pass a"
                          " .parquet file written by pyarrow or pandas") from None


def check_columns(path: Path, schema: pa.Schema) -> None:
    names = set(schema.names)
    if {"image", "label"} <= names:
        if not pa.types.is_integer(schema.field("label").type):
            raise ConfigError(f"data_path {path}: column label is {schema.field('label').type}: store class"
                              " numbers as integers")
        if not pa.types.is_binary(schema.field("image").type) and \
                not pa.types.is_large_binary(schema.field("image").type):
            raise ConfigError(f"data_path {path}: column image is {schema.field('image').type}: store the"
                              " encoded PNG/JPEG bytes")
    elif "tokens" in names:
        if not pa.types.is_list(schema.field("tokens").type) and \
                not pa.types.is_large_list(schema.field("tokens").type):
            raise ConfigError(f"data_path {path}: column tokens is {schema.field('tokens').type}: store a list"
                              " of token ids per row")
    else:
        raise ConfigError(f"data_path {path}: columns {sorted(names)}: need image+label (classification) or"
                          " tokens (language modelling)")


def decode_first_rows(path: Path, file: pq.ParquetFile) -> None:
    """Decode the first images, or check the first token rows are one length."""
    batch = next(file.iter_batches(batch_size=SAMPLES_DECODED), None)
    if batch is None:
        return
    if "image" in batch.schema.names:
        for i, raw in enumerate(batch.column("image").to_pylist()):
            try:
                with Image.open(io.BytesIO(raw or b"")) as img:
                    img.load()
            except Exception as exc:  # PIL raises several kinds for bytes that are not an image
                raise ConfigError(f"data_path {path}: row {i}: the image bytes do not decode ({type(exc).__name__}:"
                                  f" {str(exc)[:80]}): store PNG or JPEG bytes in column image") from None
    else:
        lengths = sorted(set(batch.column("tokens").value_lengths().to_pylist()))
        if len(lengths) != 1:
            raise ConfigError(f"data_path {path}: column tokens: rows have lengths {lengths}: make every row"
                              " seq_len+1 tokens long")


def parquet_sizes(cfg: TrainConfig) -> tuple[int, int]:
    """(train, val) samples of a parquet dataset, from its metadata, after its columns and first rows pass."""
    path = Path(cfg.data_path or "")
    if path.is_dir():
        files = [path / "train.parquet", path / "val.parquet"]
        if not all(f.is_file() for f in files):
            raise ConfigError(f"data_path {path}: a folder must hold train.parquet and val.parquet: add them, or"
                              " pass one .parquet file (split by val_fraction)")
    elif path.is_file():
        files = [path]
    else:
        raise ConfigError(f"data_path {path}: no such file or folder: pass a .parquet file or a folder")
    rows = []
    for f in files:
        opened = parquet_file(f)
        check_columns(f, opened.schema_arrow)
        if opened.metadata.num_rows == 0:
            raise ConfigError(f"data_path {f}: no rows: write the data into it, or point data_path elsewhere")
        decode_first_rows(f, opened)
        rows.append(opened.metadata.num_rows)
    if len(rows) == 2:
        return rows[0], rows[1]
    return rows[0] - held_out(rows[0], cfg.val_fraction), held_out(rows[0], cfg.val_fraction)


def dataset_sizes(cfg: TrainConfig, name: str, user: Mapping[str, Any]) -> tuple[int, int]:
    if name == "parquet":
        return parquet_sizes(cfg)
    return builtin_sizes(cfg, name)


def check_data(cfg: TrainConfig, name: str, workers: int, user: Mapping[str, Any] | None = None) -> None:
    """Refuse, in one ConfigError line, data that the run could not train on (see the module's text)."""
    if is_import_path(name):
        return
    n_train, n_val = dataset_sizes(cfg, name, user or {})
    per_worker = -(-n_train // workers)  # DistributedSampler pads the last worker's share
    batches = per_worker // cfg.batch_size
    if batches < cfg.grad_accum:
        at = f" at seq_len {cfg.seq_len}" if name in ("stdlib-text", "fake-tokens") else ""
        raise ConfigError(f"dataset {name}: {n_train} training samples{at} over {workers} worker(s) are"
                          f" {per_worker} per worker: fewer than one step needs (batch_size {cfg.batch_size} x"
                          f" grad_accum {cfg.grad_accum}): lower them, use fewer workers or more data")
    if n_val == 0:
        raise ConfigError(f"dataset {name}: no validation samples (val_fraction {cfg.val_fraction}): raise"
                          " val_fraction or give more data")
