"""A Ray address (`host:port`) checked for form when it is read, and for an answer before a driver joins:
Ray's own connect waits minutes on an address nobody answers at."""

from __future__ import annotations

import re
import socket
import time

from groundwork.errors import ConfigError

ADDRESS = re.compile(r"^(?P<host>[A-Za-z0-9][A-Za-z0-9.\-]*|\[[0-9A-Fa-f:]+\]):(?P<port>\d{1,5})$")
CONNECT_TIMEOUT_S = 15.0
RETRY_EVERY_S = 0.5


def check_address(text: str) -> str:
    """`text` if it is host:port with a port in 1..65535; else ValueError saying so (for a pydantic field)."""
    found = ADDRESS.match(text)
    if not found or not 0 < int(found["port"]) < 65536:
        raise ValueError(f"{text!r} is not a Ray address: give host:port (e.g. 10.0.0.1:6379, the head's GCS"
                         " port)")
    return text


def free_port() -> int:
    """A TCP port free on every interface of this machine now (a rendezvous port other nodes connect to)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def wait_reachable(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Return once something accepts a TCP connection at `address`, trying until `timeout` seconds have
    passed (a head still starting answers within them); else ConfigError naming the address and what failed."""
    try:
        host, port = check_address(address).rsplit(":", 1)
    except ValueError as exc:
        raise ConfigError(f"address: {exc}") from None
    deadline = time.monotonic() + timeout
    tries, last = 0, ""
    while True:
        tries += 1
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=max(0.1, deadline - time.monotonic())):
                return
        except OSError as exc:
            last = exc.strerror or type(exc).__name__
        if time.monotonic() + RETRY_EVERY_S > deadline:
            raise ConfigError(f"address {address}: nothing answers there ({last.lower()}, {tries} tries in"
                              f" {timeout:g} s): start the cluster (`orchestrator cluster up SPEC`) or fix the"
                              " address; --connect-timeout waits longer")
        time.sleep(RETRY_EVERY_S)
