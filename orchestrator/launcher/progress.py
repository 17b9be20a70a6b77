"""A live rich progress bar fed by the MetricsSink: epoch, step, loss and samples/s."""

from __future__ import annotations

import time
from collections.abc import Callable

import ray
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from orchestrator.raytrain.periodic import Periodic


class LiveRows(Periodic):
    """Polls the sink from a thread; keeps every row seen so the driver never loses one."""

    def __init__(self, sink: ray.actor.ActorHandle, on_rows: Callable[[list[dict]], None] | None = None,
                 every_s: float = 0.5) -> None:
        super().__init__(every_s, "orchestrator-rows")
        self.sink = sink
        self.rows: list[dict[str, float]] = []
        self.on_rows = on_rows

    def tick(self) -> None:
        new = ray.get(self.sink.since.remote(len(self.rows)))
        if new:
            self.rows.extend(new)
            if self.on_rows:
                self.on_rows(self.rows)

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self.tick()  # the last rows pushed before the workers finished


def validation_line(row: dict) -> str:
    acc = f"  val_acc {row['val_acc']:.4f}" if row.get("val_acc") is not None else ""
    return f"epoch {row.get('epoch', 0):g}  step {int(row.get('step', 0))}  val_loss {row['val_loss']:.4f}{acc}"


def world_change(before: float | None, row: dict) -> str | None:
    """A line when an elastic run goes on with fewer (a node lost) or more workers than its rows had."""
    now = row.get("world_size")
    if before is None or now is None or now == before:
        return None
    return (f"step {int(row.get('step', 0))}: {now:g} worker(s), was {before:g} (resumed from the newest"
            " checkpoint, global batch kept)")


def progress_bar(epochs: int | None) -> tuple[Progress, Callable[[list[dict]], None]]:
    """The shared loop's bar (epochs known), or a train function's (`epochs` None: its own reports, and their
    rate, drive it)."""
    head = "[bold]epoch {task.completed:.2f}/{task.total:.0f}" if epochs else "[bold]report {task.fields[report]}"
    progress = Progress(TextColumn(head), BarColumn(),
                        TextColumn("step {task.fields[step]}  loss {task.fields[loss]}  {task.fields[speed]}"),
                        TimeElapsedColumn())
    task = progress.add_task("train", total=epochs, step=0, loss="-", speed="", report=0)
    started = time.monotonic()

    printed = [0]  # rows already looked at for validation lines
    world: list[float | None] = [None]  # the workers of the newest row that says

    def update(rows: list[dict]) -> None:
        for row in rows[printed[0]:]:  # lines kept above the bar
            if row.get("val_loss") is not None:
                progress.console.print(validation_line(row))
            if (change := world_change(world[0], row)) is not None:
                progress.console.print(change)
            world[0] = row.get("world_size", world[0])
        printed[0] = len(rows)
        last = rows[-1]
        loss = next((r["loss"] for r in reversed(rows) if r.get("loss") is not None), None)
        speed = next((r["samples_per_s"] for r in reversed(rows) if r.get("samples_per_s")), None)
        rate = f"{speed:,.0f} samples/s" if speed else f"{len(rows) / (time.monotonic() - started):.2f} reports/s"
        progress.update(task, completed=last.get("epoch", 0), step=int(last.get("step", 0)), report=len(rows),
                        loss=f"{loss:.4f}" if loss is not None else "-", speed=rate if epochs is None or speed else "")
    return progress, update
