"""Shared fixtures. One embedded Ray per test session (starting one costs seconds); every launch reuses it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"

# Ray reads RAY_AUTH_MODE at import: present the local token to the `cluster up` clusters tests join.
if os.path.exists(os.path.expanduser("~/.ray/auth_token")):
    os.environ.setdefault("RAY_AUTH_MODE", "token")

# Ray workers are new processes: they find the project and tests/helpers.py through PYTHONPATH, not pytest's
# sys.path. Set before Ray starts so its workers inherit it.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(REPO), str(REPO / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])])


@pytest.fixture(scope="session")
def ray_local():
    import ray

    from cluster.spec import load_spec
    from orchestrator.raytrain.session import start_local

    start_local(load_spec())
    yield ray
    ray.shutdown()


@pytest.fixture
def in_tmp(tmp_path, monkeypatch) -> Path:
    """Run in a fresh folder, so runs/ lands in it."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 600,
            env: dict[str, str | None] | None = None) -> subprocess.CompletedProcess:
    """The CLI in a new process; `env` adds variables to this one's (None: removes one)."""
    merged = {**os.environ, "COLUMNS": "200", **(env or {})}  # rich wraps tables to the terminal: rows whole
    env = {k: v for k, v in merged.items() if v is not None}
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env=env)


def pytest_collection_modifyitems(config, items):
    """`slow` tests run only when asked for (ORCH_SLOW=1, or -m slow): the default suite stays CI-sized."""
    if os.environ.get("ORCH_SLOW") == "1" or "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with ORCH_SLOW=1 or -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
