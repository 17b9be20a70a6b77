"""A torchrun script's output on a quiet terminal: Ray forwards no worker output then, so the driver follows
rank 0's log (every rank's with --tee) in the run folder and prints the script's own lines with a `[rank N]`
prefix; the worker's INFO lines and the start line stay in the file."""

from __future__ import annotations

import re
from pathlib import Path

from orchestrator.raytrain.periodic import Periodic

OURS = re.compile(r"^(\[rank \d+\] \d{4}-\d\d-\d\d \S+ (DEBUG|INFO) |starting )")  # the worker's, not the script's


class LogTail(Periodic):
    def __init__(self, logs: Path, every_rank: bool, every_s: float = 0.3) -> None:
        super().__init__(every_s, "orchestrator-tail")
        self.logs, self.every_rank = logs, every_rank
        self.read: dict[Path, int] = {}  # bytes of each file already printed

    def files(self) -> list[Path]:
        return sorted(self.logs.glob("rank-*.log")) if self.every_rank else [self.logs / "rank-0.log"]

    def tick(self) -> None:
        for path in self.files():
            if not path.exists():
                continue
            with path.open("rb") as file:
                file.seek(self.read.get(path, 0))
                chunk = file.read()
            whole = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits for the next tick
            self.read[path] = self.read.get(path, 0) + len(whole)
            rank = path.stem.split("-")[1]
            for line in whole.decode(errors="replace").splitlines():
                if not OURS.match(line):
                    print(f"[rank {rank}] {line}", flush=True)

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self.tick()  # what the script printed last
