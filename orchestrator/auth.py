"""Ray 2.60's token authentication, seen from a driver. No Ray import here: this must run before Ray's."""

from __future__ import annotations

import os


def present_token() -> None:
    """Ray reads RAY_AUTH_MODE when it is imported: with a token on this machine, a driver joining a cluster
    must say `token` or it connects with none and is refused. Called when `orchestrator` is imported, so
    `import orchestrator` before `import ray` is enough."""
    if os.path.exists(os.path.expanduser("~/.ray/auth_token")) or os.environ.get("RAY_AUTH_TOKEN"):
        os.environ.setdefault("RAY_AUTH_MODE", "token")
