"""Checkpoint state: model (by stage-independent names), optimizer, LR schedule, grad scaler, position in the
data, and every RNG the run draws from. Loaded with weights_only=True: no pickled code runs on load.

A checkpoint folder is complete only with its manifest (each file's size and sha256), written last, and the
folder appears under its final name in one rename: a process killed mid-save leaves a `.partial-*` folder,
never a half-written checkpoint. A folder that fails its manifest (truncated, corrupted, copied in part) is
skipped with a warning and the next older one is used.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from groundwork.errors import CheckpointError

if TYPE_CHECKING:
    import torch  # annotations only

log = logging.getLogger(__name__)
STATE_FILE = "state.pt"
MANIFEST_FILE = "manifest.json"


def rng_state() -> dict[str, Any]:
    import torch  # here: a driver that only lists or checks checkpoints never imports torch

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
    import torch  # here: a driver that only lists or checks checkpoints never imports torch

    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate((state["python_version"], tuple(state["python"]), None))
    np.random.set_state(("MT19937", state["numpy_keys"].numpy().astype(np.uint32), state["numpy_pos"], 0, 0.0))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_state(state: dict[str, Any], folder: str | Path) -> Path:
    """Write state.pt and its manifest into `folder` (new, or empty) atomically: all of it or nothing."""
    import torch  # here: a driver that only lists or checks checkpoints never imports torch

    folder = Path(folder)
    if folder.exists():
        folder.rmdir()  # only an empty folder (a fresh mkdtemp) may be replaced
    folder.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".partial-{folder.name}-", dir=folder.parent))
    torch.save(state, partial / STATE_FILE)
    write_manifest(partial, [STATE_FILE])
    os.replace(partial, folder)
    return folder / STATE_FILE


def write_manifest(folder: Path, names: Iterable[str]) -> None:
    files = {}
    for name in names:
        _fsync(folder / name)  # the bytes are on disk before the manifest vouches for them
        files[name] = {"bytes": (folder / name).stat().st_size, "sha256": _sha256(folder / name)}
    (folder / MANIFEST_FILE).write_text(json.dumps({"files": files}, indent=1))
    _fsync(folder / MANIFEST_FILE)


def verify(folder: str | Path) -> str | None:
    """None if the folder holds every file its manifest lists, with the listed size and sha256; else why not."""
    folder = Path(folder)
    manifest = folder / MANIFEST_FILE
    if not manifest.exists():
        return f"no {MANIFEST_FILE} (the save did not finish)"
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError) as exc:
        return f"{MANIFEST_FILE} is unreadable ({exc})"
    for name, want in files.items():
        path = folder / name
        if not path.exists():
            return f"{name} is missing"
        if path.stat().st_size != want["bytes"]:
            return f"{name} has {path.stat().st_size} bytes, the manifest says {want['bytes']}"
        if _sha256(path) != want["sha256"]:
            return f"{name} does not match its sha256 in the manifest"
    return None


def load_state(folder: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    import torch  # here: a driver that only lists or checks checkpoints never imports torch

    problem = verify(folder)
    if problem:
        raise CheckpointError(f"checkpoint {folder}: {problem}")
    state = torch.load(Path(folder) / STATE_FILE, map_location=map_location, weights_only=True)
    if state.get("format") == "sharded":  # model and optimizer are in its shards (trainables.parallel.dcp)
        state["folder"] = str(folder)
    return state


def load_latest(folders: Iterable[str | Path]) -> tuple[Path, dict[str, Any]] | None:
    """The first checkpoint in `folders` (newest first) that passes its manifest; bad ones are skipped."""
    for folder in folders:
        try:
            return Path(folder), load_state(folder)
        except CheckpointError as exc:
            log.warning("%s: skipped, trying an older checkpoint", exc)
    return None


def newest_complete(folders: Iterable[str | Path]) -> Path | None:
    """The first folder of `folders` (newest first) that passes its manifest, without loading it."""
    for folder in folders:
        problem = verify(folder)
        if problem is None:
            return Path(folder)
        log.warning("checkpoint %s: %s: skipped, trying an older checkpoint", folder, problem)
    return None


def resume_state(folders: list[Path]) -> dict[str, Any] | None:
    """The state a run resumes from: the newest complete checkpoint of `folders` (newest first). None when
    there are none (resumed before its first checkpoint: it starts over); an error when every one is bad."""
    if not folders:
        return None
    found = load_latest(folders)
    if found is None:
        raise CheckpointError(f"no complete checkpoint to resume from in {folders[0].parent}:"
                              " every one failed its manifest")
    log.info("resuming from %s", found[0])
    return found[1]


def checkpoints_in(run_dir: str | Path) -> list[Path]:
    """A run folder's checkpoint folders, newest first (their names sort by time or by number)."""
    return sorted((p for p in Path(run_dir).glob("checkpoint_*") if p.is_dir()), reverse=True)


def move_checkpoint(src: str | Path, dest: str | Path) -> Path:
    """Move a checkpoint folder its writer is done with (the loop deletes its own once reported) so that
    `dest` appears complete or not at all: renamed where both are on one file system (no copy of the state:
    a sweep's trial reports one every epoch), else copied."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f".partial-{dest.name}")
    shutil.rmtree(partial, ignore_errors=True)
    moved = True
    try:
        os.rename(src, partial)
    except OSError as exc:
        if exc.errno != errno.EXDEV:  # not "another file system": a real error
            raise
        shutil.copytree(src, partial)
        moved = False
    try:
        os.replace(partial, dest)
    except OSError:
        if moved:  # the writer's folder back where it was
            os.rename(partial, src)
        raise
    return dest
