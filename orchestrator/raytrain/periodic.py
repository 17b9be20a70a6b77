"""A daemon thread that does one thing every few seconds between `with` entry and exit: the driver's metric
poller and watchdog, and each worker's heartbeat."""

from __future__ import annotations

import threading


class Periodic:
    """Subclasses define `tick`. A tick that raises ends the thread: the actor it talks to is gone, and
    whatever waits on that actor (fit(), the training loop) reports it better."""

    def __init__(self, every_s: float, name: str) -> None:
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def tick(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.tick()
            except Exception:
                return

    def __enter__(self) -> Periodic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
