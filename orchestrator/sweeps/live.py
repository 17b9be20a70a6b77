"""A live rich table of the sweep's trials: running, finished, stopped early or errored, with the metric."""

from __future__ import annotations

from typing import Any

from ray import tune
from rich.live import Live
from rich.table import Table


class LiveTrialTable(tune.Callback):
    def __init__(self, metric: str, mode: str, epochs: int) -> None:
        self.metric, self.mode, self.epochs = metric, mode, epochs
        self.trials: dict[str, dict[str, Any]] = {}
        self.live: Live | None = None

    def _row(self, trial: Any) -> dict[str, Any]:
        return self.trials.setdefault(trial.trial_id, {"status": "pending", "iter": 0, "best": None,
                                                       "params": {}})

    def _render(self) -> Table:
        table = Table("trial", "status", "epochs", f"best {self.metric}", "params",
                      title=f"sweep: {sum(r['status'] != 'running' for r in self.trials.values())}"
                            f"/{len(self.trials)} trials done")
        for trial_id, row in self.trials.items():
            best = f"{row['best']:.4f}" if row["best"] is not None else "-"
            params = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                               for k, v in row["params"].items())
            table.add_row(trial_id, row["status"], f"{row['iter']}/{self.epochs}", best, params)
        return table

    def _refresh(self) -> None:
        if self.live is None:
            self.live = Live(self._render(), refresh_per_second=2, transient=False)
            self.live.start()
        self.live.update(self._render())

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        row = self._row(trial)
        row.update(status="running", params=trial.config)
        self._refresh()

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        row = self._row(trial)
        row["iter"] = result.get("training_iteration", row["iter"])
        value = result.get(self.metric)
        if value is not None:
            better = row["best"] is None or (value > row["best"] if self.mode == "max" else value < row["best"])
            row["best"] = value if better else row["best"]
        self._refresh()

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        row = self._row(trial)
        row["status"] = "finished" if row["iter"] >= self.epochs else "stopped early"
        self._refresh()

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self._row(trial)["status"] = "errored"
        self._refresh()

    def on_experiment_end(self, trials, **info) -> None:
        if self.live is not None:
            self.live.update(self._render())
            self.live.stop()
