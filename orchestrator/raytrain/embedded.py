"""Ray Train's controller as this project runs it (Ray 2.60 internals, named where they are used): its workers
get no runtime env for the variables every process of a Ray this driver started has already, and for the
shared loop and scripts it runs in the driver itself rather than in an actor of its own."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

import ray
from ray.runtime_context import RuntimeContext
from ray.train.v2._internal.execution.controller import TrainController
from ray.train.v2._internal.execution.worker_group import WorkerGroup
from ray.train.v2._internal.logging import LoggingManager

from orchestrator.raytrain.session import nothing, replaced

NO_CONTROLLER_HANDLE = property(lambda context: None)


class EmbeddedController(TrainController):
    """Ray's controller, whose workers get a runtime env only for what the environment every process of the
    Ray this driver started with (`held_env`; {} on a Ray it joined) lacks. With a runtime env, Ray asks its
    runtime-env agent for it and starts each worker through setup_worker.py (a Python that imports Ray, then
    execs the worker's own: ~0.4 CPU-s a rank, on cores busy importing torch); without, a plain worker.

    `in_driver`: the controller runs in this process (`run_here`), not in an actor: Ray's starts a process
    that imports Ray Train (~0.8 CPU-s) and waits for it before it creates the workers; measured alternated on
    2 CPUs, the first step came 0.6-0.8 s sooner (5.4 vs 6.2 s). Its log lines go to the driver's `ray.train`
    logger (Ray's actor configures that logger for a process of its own, with its own console handler), and
    its workers hold no handle to it (only `ray.train.get_all_reported_checkpoints` uses one)."""

    def __init__(self, *, held_env: dict[str, str], in_driver: bool = False, **kwargs: Any) -> None:
        with replaced([(LoggingManager, "configure_controller_logger", staticmethod(nothing))] if in_driver else []):
            super().__init__(**kwargs)
        self.worker_group_cls = held_env_worker_group(held_env, in_driver)  # Ray 2.60: the class it creates

    def run_here(self) -> Any:
        """The control loop on this thread, to the end of the run; returns Ray's Result. Any other way out
        (Ctrl-C: KeyboardInterrupt, an error of the controller's own) ends the worker group first: every
        rank, its process group, and the group's placement group, as Ray's abort does."""
        try:
            with interrupted_at_once():
                asyncio.run(self.run())
        except BaseException:
            # Ray's abort, which ends by ending its actor: here there is none
            with replaced([(ray.actor, "exit_actor", nothing)]):
                asyncio.run(self.abort())
            raise
        return self.get_result()


@contextlib.contextmanager
def interrupted_at_once() -> Iterator[None]:
    """On the main thread, SIGINT (Ctrl-C; `orchestrator jobs stop`) raises KeyboardInterrupt wherever the loop
    is, as in any driver and as Ray's own handler for its controller's actor does, also where the process
    started with SIGINT ignored (a launch started in the background of a script inherits that: CI's runner
    starts the tests so). asyncio.run's own handler is installed only over Python's default one, and it
    cancels the loop's task, which takes effect only where that task next awaits."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def held_env_worker_group(held_env: dict[str, str], in_driver: bool) -> type[WorkerGroup]:
    class HeldEnvWorkerGroup(WorkerGroup):
        def _get_worker_runtime_env(self, custom_runtime_env: dict) -> dict:  # Ray 2.60's (a staticmethod)
            return held_env_only(super()._get_worker_runtime_env(custom_runtime_env), held_env)

        def _init_train_context_on_workers(self, *args: Any, **kwargs: Any) -> None:
            # Ray 2.60 hands each worker `ray.get_runtime_context().current_actor`: the controller's actor
            with replaced([(RuntimeContext, "current_actor", NO_CONTROLLER_HANDLE)] if in_driver else []):
                super()._init_train_context_on_workers(*args, **kwargs)

    return HeldEnvWorkerGroup


def held_env_only(runtime_env: dict, held_env: dict[str, str]) -> dict:
    """`runtime_env` less the variables that hold in `held_env` (and its env_vars, where none is left)."""
    env_vars = {name: value for name, value in runtime_env.get("env_vars", {}).items()
                if held_env.get(name) != value}
    rest = {key: value for key, value in runtime_env.items() if key != "env_vars"}
    return {**rest, "env_vars": env_vars} if env_vars else rest
