"""Python logging with the rank in every line, to stderr (Ray forwards it to the driver) and to a per-rank
file in the run folder, so a rank that failed can be read on its own."""

from __future__ import annotations

import logging
from pathlib import Path

FORMAT = "[rank %(rank)s] %(asctime)s %(levelname)s %(name)s: %(message)s"


class _RankFilter(logging.Filter):
    def __init__(self, rank: int | str) -> None:
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True


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
