"""The run's rows logged to MLflow (`--mlflow URI`: a tracking server, `sqlite:///mlflow.db`, or a local
`file:` store), as they arrive: one MLflow run per launch, named after it, in the experiment "orchestrator",
with the launch's settings as parameters. MLflow is imported on the first rows, in the thread that polls them."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from orchestrator.config import LaunchConfig

log = logging.getLogger(__name__)
EXPERIMENT = "orchestrator"


def flat(settings: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested settings as MLflow parameters: `train.lr` -> "0.001"."""
    out: dict[str, str] = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        elif value is not None:
            out[f"{prefix}{key}"] = str(value)[:500]
    return out


class MlflowRows:
    def __init__(self, uri: str | None, cfg: LaunchConfig) -> None:
        self.uri, self.cfg = uri, cfg
        self.client: Any = None
        self.run_id = ""
        self.written = 0

    def start(self) -> None:
        if self.uri.startswith("file:"):  # MLflow 3 keeps its file store only on request
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient  # deferred: a second of imports, only with --mlflow

        self.client = MlflowClient(tracking_uri=self.uri)
        found = self.client.get_experiment_by_name(EXPERIMENT)
        experiment = found.experiment_id if found else self.client.create_experiment(EXPERIMENT)
        self.run_id = self.client.create_run(experiment, run_name=self.cfg.name).info.run_id
        params = flat(self.cfg.saved_form())
        from mlflow.entities import Param  # deferred: as above

        self.client.log_batch(self.run_id, params=[Param(k, v) for k, v in sorted(params.items())])

    def __call__(self, rows: list[dict[str, Any]]) -> None:
        if self.uri is None or self.client is False:
            return
        try:
            if self.client is None:
                self.start()
            from mlflow.entities import Metric  # deferred: as above

            now = int(time.time() * 1000)
            metrics = [Metric(key, float(value), now, int(row.get("step", 0))) for row in rows[self.written:]
                       for key, value in row.items() if key != "step" and isinstance(value, int | float)]
            for i in range(0, len(metrics), 1000):  # MLflow takes at most 1000 metrics per batch
                self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])
            self.written = len(rows)
        except Exception as exc:  # a server gone, a store not writable: the run goes on, its rows are on disk
            log.warning("MLflow logging stopped (%s: %s)", type(exc).__name__, str(exc)[:200])
            self.client = False

    def close(self, status: str = "FINISHED") -> None:
        if self.client:
            self.client.set_terminated(self.run_id, status)
