"""Checkpoint state: model (by stage-independent names), optimizer, LR schedule, grad scaler, position in the
data, and every RNG the run draws from. Loaded with weights_only=True: no pickled code runs on load."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

STATE_FILE = "state.pt"


def rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": list(random.getstate()[1]),
        "python_version": random.getstate()[0],
        "numpy_keys": torch.from_numpy(np_state[1].astype(np.int64)),
        "numpy_pos": int(np_state[2]),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate((state["python_version"], tuple(state["python"]), None))
    np.random.set_state(("MT19937", state["numpy_keys"].numpy().astype(np.uint32), state["numpy_pos"], 0, 0.0))


def save_state(state: dict[str, Any], folder: str | Path) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / STATE_FILE
    torch.save(state, path)
    return path


def load_state(folder: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    return torch.load(Path(folder) / STATE_FILE, map_location=map_location, weights_only=True)
