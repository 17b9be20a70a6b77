"""Soak: back-to-back short launches on one embedded Ray leave nothing behind: no Ray worker processes, no
placement groups, no live actors, no open files in the driver beyond what the first launch left (Ray keeps a
small pool of idle workers; it must not grow). 50 launches take ~14 min on 2 cores: marked slow."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import orchestrator

LAUNCHES = int(os.environ.get("ORCH_SOAK_LAUNCHES", "50"))


def ray_processes() -> int:
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue  # exited while we looked
            count += b"ray::" in cmdline or b"default_worker.py" in cmdline
    return count


def snapshot(ray) -> dict[str, int]:
    return {
        "ray processes": ray_processes(),
        "placement groups": sum(g["state"] != "REMOVED" for g in ray.util.placement_group_table().values()),
        "live actors": sum(a["State"] != "DEAD" for a in ray._private.state.actors().values()),
        "open files": len(os.listdir("/proc/self/fd")),
    }


@pytest.mark.slow
def test_many_short_launches_leak_nothing(ray_local, in_tmp):
    def launch(i: int) -> None:
        run = orchestrator.launch(model="digits-cnn", workers=2, max_steps=2, epochs=1, quiet=True, name=f"s{i}")
        assert run.metrics["step"] == 2

    launch(0)  # the first launch starts Ray's worker pool and imports; count from here
    warm = snapshot(ray_local)
    for i in range(1, LAUNCHES):
        launch(i)
    after = snapshot(ray_local)
    assert after["placement groups"] == 0
    assert all(after[key] <= warm[key] for key in warm), (warm, after)
    assert len(list((in_tmp / "runs").iterdir())) == LAUNCHES
