"""Ray Train's controller on a Ray this driver started (Ray 2.60 internals, named where they are used): its
workers get no runtime env for the variables every process of that Ray has already."""

from __future__ import annotations

from typing import Any

from ray.train.v2._internal.execution.controller import TrainController
from ray.train.v2._internal.execution.worker_group import WorkerGroup


class EmbeddedController(TrainController):
    """Ray's controller on a Ray this driver started, whose workers get a runtime env only for what the
    environment every process of that Ray started with (`held_env`) lacks. With a runtime env, Ray asks its
    runtime-env agent for it and starts each worker through setup_worker.py (a Python that imports Ray, then
    execs the worker's own: ~0.4 CPU-s a rank, on cores busy importing torch); without, a plain worker."""

    def __init__(self, *, held_env: dict[str, str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.worker_group_cls = held_env_worker_group(held_env)  # Ray 2.60: the class the controller creates


def held_env_worker_group(held_env: dict[str, str]) -> type[WorkerGroup]:
    class HeldEnvWorkerGroup(WorkerGroup):
        def _get_worker_runtime_env(self, custom_runtime_env: dict) -> dict:  # Ray 2.60's (a staticmethod)
            return held_env_only(super()._get_worker_runtime_env(custom_runtime_env), held_env)

    return HeldEnvWorkerGroup


def held_env_only(runtime_env: dict, held_env: dict[str, str]) -> dict:
    """`runtime_env` less the variables that hold in `held_env` (and its env_vars, where none is left)."""
    env_vars = {name: value for name, value in runtime_env.get("env_vars", {}).items()
                if held_env.get(name) != value}
    rest = {key: value for key, value in runtime_env.items() if key != "env_vars"}
    return {**rest, "env_vars": env_vars} if env_vars else rest
