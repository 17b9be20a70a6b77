"""Sharded checkpoints (`--checkpoint-format sharded`) through torch.distributed.checkpoint (DCP): every rank
writes its own shards of the model and optimizer state into one folder on the run's storage (shared by the
nodes), rank 0 adds state.pt with the rest (position, schedule, RNG, config) and the manifest, last. No rank
ever holds the whole model, which a full checkpoint gathers on rank 0. DCP reshards on load, so the folder
resumes on any number of workers and under any strategy (DDP too).

The folder keeps the guarantees of every checkpoint (trainables.checkpoint): written under a `.partial-`
name and renamed once complete, its manifest listing every shard file with its size and sha256."""

from __future__ import annotations

import os
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
    state = {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, optimizer)}
    dcp.save(state, checkpoint_id=partial / SHARDS)  # collective: returns once every rank's shards are written
    if rest is not None:
        torch.save({**rest, "format": "sharded"}, partial / STATE_FILE)
        shards = sorted(str(p.relative_to(partial)) for p in (partial / SHARDS).rglob("*") if p.is_file())
        write_manifest(partial, [STATE_FILE, *shards])
        os.replace(partial, folder)
    dist.barrier()  # the folder is complete before any rank goes on (and reports it)


def load_sharded(model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Load a sharded checkpoint into this rank's model and optimizer, whatever their sharding or world size."""
    state = {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, optimizer)}
    dcp.load(state, checkpoint_id=folder / SHARDS)
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optimizer"])
