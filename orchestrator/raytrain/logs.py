"""Python logging with the rank in every line, to stderr (Ray forwards it to the driver) and to a per-rank
file in the run folder, so a rank that failed can be read on its own."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

FORMAT = "[rank %(rank)s] %(asctime)s %(levelname)s %(name)s: %(message)s"


class _RankFilter(logging.Filter):
    def __init__(self, rank: int | str) -> None:
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True


class _Tee:
    """A text stream that writes to two."""

    def __init__(self, first: TextIO, second: TextIO) -> None:
        self.first, self.second = first, second

    def write(self, text: str) -> int:
        self.second.write(text)
        return self.first.write(text)

    def flush(self) -> None:
        self.first.flush()
        self.second.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.first, name)


@contextlib.contextmanager
def rank_output(rank: int, log_dir: str | Path | None) -> Iterator[None]:
    """`print` output goes into this rank's log file too (Ray forwards it to the driver as before), so a
    user's own output can be read per rank. Not stderr: Ray Train's own chatter goes there, and a failing
    rank's traceback reaches the file through logging (orchestrator.raytrain.worker)."""
    if log_dir is None:
        yield
        return
    saved = sys.stdout
    with open(Path(log_dir) / f"rank-{rank}.log", "a", buffering=1) as file:
        sys.stdout = _Tee(saved, file)
        try:
            yield
        finally:
            sys.stdout = saved


def setup_rank_logging(rank: int | str, log_dir: str | Path | None, level: int = logging.INFO) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    if log_dir is not None:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(Path(log_dir) / f"rank-{rank}.log"))
    for handler in handlers:
        handler.addFilter(_RankFilter(rank))
        handler.setFormatter(logging.Formatter(FORMAT))
    for name in ("trainables", "orchestrator", "user"):
        logger = logging.getLogger(name)
        logger.handlers = handlers
        logger.setLevel(level)
        logger.propagate = False
