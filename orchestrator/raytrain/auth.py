"""Ray 2.60's token authentication, seen from a driver. No Ray import here: this must run before Ray's."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

TOKEN_FILE = Path("~/.ray/auth_token")  # where Ray 2.60 reads (and `ray get-auth-token --generate` writes) it


def present_token() -> None:
    """Ray reads RAY_AUTH_MODE when it is imported: with a token on this machine, a driver joining a cluster
    must say `token` or it connects with none and is refused. Called when `orchestrator` is imported, so
    `import orchestrator` before `import ray` is enough."""
    if os.path.exists(os.path.expanduser("~/.ray/auth_token")) or os.environ.get("RAY_AUTH_TOKEN"):
        os.environ.setdefault("RAY_AUTH_MODE", "token")


def ensure_token() -> bool:
    """Make this machine's token as `ray get-auth-token --generate` does (64 hex digits, ~/.ray/auth_token),
    unless one exists or the environment names one; for a cluster this process starts (`cluster up`, the
    embedded Ray), whose head must find it. True if it made one."""
    if any(os.environ.get(k) for k in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")):
        return False
    path = TOKEN_FILE.expanduser()
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # only its owner reads a credential
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return True


# Connect with no token at all (an empty home, auth mode off): only a cluster without token auth answers.
_PROBE = ("import sys\nfrom ray._raylet import GcsClient\n"
          "GcsClient(address=sys.argv[1]).internal_kv_keys(b'', None, timeout=5)")


def accepts_anonymous(address: str) -> bool:
    """True if the Ray cluster at `address` serves a client that presents no token: its token auth is off.
    Asked from a fresh process, since a process's auth mode is fixed when it imports Ray."""
    with tempfile.TemporaryDirectory() as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH_TOKEN")}
        env.update(HOME=home, RAY_AUTH_MODE="disabled")
        try:
            proc = subprocess.run([sys.executable, "-c", _PROBE, address], env=env, capture_output=True,
                                  timeout=30)
        except subprocess.TimeoutExpired:
            return False  # unreachable: ray.init will say so
    return proc.returncode == 0


def warn_if_open(address: str) -> None:
    if accepts_anonymous(address):
        print(f"orchestrator: warning: the Ray cluster at {address} has token authentication off: anyone who"
              " can reach it can run code on it; restart it with RAY_AUTH_MODE=token (Ray's default since 2.60)",
              file=sys.stderr)
