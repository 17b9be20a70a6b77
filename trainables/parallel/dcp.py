"""Sharded checkpoints (`--checkpoint-format sharded`) through torch.distributed.checkpoint (DCP): every rank
writes its own shards of the model and optimizer state into one folder on the run's storage (shared by the
nodes), rank 0 adds state.pt with the rest (position, schedule, RNG, config) and the manifest, last. No rank
ever holds the whole model, which a full checkpoint gathers on rank 0. DCP reshards on load, so the folder
resumes on any number of workers and under any strategy (DDP too).

The folder keeps the guarantees of every checkpoint (trainables.checkpoint): written under a `.partial-`
name and renamed once complete, its manifest listing every shard file with its size and sha256."""

from __future__ import annotations

import io
import os
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from trainables.checkpoint import STATE_FILE, write_manifest

SHARDS = "shards"  # DCP's files, inside the checkpoint folder


def save_sharded(model: nn.Module, optimizer: torch.optim.Optimizer, rest: dict[str, Any] | None,
                 partial: Path, folder: Path) -> None:
    """Every rank calls it with the same `partial` (a new folder name on shared storage) and `folder`; rank 0
    passes `rest` (everything but model and optimizer) and renames `partial` to `folder` when all is on disk."""
    dcp.save(_state(model, optimizer), checkpoint_id=partial / SHARDS)  # collective: every rank's shards written
    if rest is not None:
        complete(partial, folder, _saved(rest))
    dist.barrier()  # the folder is complete before any rank goes on (and reports it)


def save_sharded_async(model: nn.Module, optimizer: torch.optim.Optimizer, rest: dict[str, Any] | None,
                       partial: Path, folder: Path, group: dist.ProcessGroup) -> BackgroundSave:
    """save_sharded with the writing in the background: returns once this rank's state is copied to host
    memory (DCP's async_save; its own collectives go over `group`, not the one training uses meanwhile).
    `rest` is taken now: the run goes on and changes it."""
    future = dcp.async_save(_state(model, optimizer), checkpoint_id=partial / SHARDS, process_group=group)
    return BackgroundSave(future, partial, folder, _saved(rest) if rest is not None else None)


@dataclass
class BackgroundSave:
    """A sharded checkpoint being written by DCP's thread."""

    future: Future
    partial: Path
    folder: Path
    rest: bytes | None  # rank 0's: everything but model and optimizer, as at the step it was taken

    def written(self) -> None:
        """Returns once this rank's shards are on disk (rank 0's: every rank's, and DCP's metadata)."""
        self.future.result()

    def finish(self) -> None:
        """Rank 0: once every rank's shards are written, complete the folder as save_sharded does."""
        self.written()
        assert self.rest is not None, "rank 0 finishes the folder"
        complete(self.partial, self.folder, self.rest)


def complete(partial: Path, folder: Path, rest: bytes) -> None:
    """Rank 0, once every rank's shards are in `partial`: the rest of the state, the manifest last, then the
    folder under its final name."""
    (partial / STATE_FILE).write_bytes(rest)
    shards = sorted(str(p.relative_to(partial)) for p in (partial / SHARDS).rglob("*") if p.is_file())
    write_manifest(partial, [STATE_FILE, *shards])
    os.replace(partial, folder)


def _state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    return {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, optimizer)}


def _saved(rest: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save({**rest, "format": "sharded"}, buffer)
    return buffer.getvalue()


def load_sharded(model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Load a sharded checkpoint into this rank's model and optimizer, whatever their sharding or world size."""
    state = _state(model, optimizer)
    dcp.load(state, checkpoint_id=folder / SHARDS)
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optimizer"])
