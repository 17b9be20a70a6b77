"""Starting warm groups: one desk per group, each group one TorchTrainer fit in a thread of this process, its
workers running orchestrator.warm.worker.group_worker. A sweep starts them for its length; a pool's keeper
actor starts one for as long as the pool is up.

A fresh Ray Train run per trial costs ~20 s on a small machine before its first step (a controller and the
workers, each a new Python importing torch, then the process group); a warm group pays that once and then
runs trial after trial of the shared loop.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import ray

from cluster.plan import Plan
from orchestrator.raytrain.session import on_this_node
from orchestrator.raytrain.trainer import failure_line, make_trainer
from orchestrator.warm.desk import Desk
from orchestrator.warm.worker import GroupArgs, group_worker

log = logging.getLogger("orchestrator.warm")
RemoteDesk = ray.remote(num_cpus=0, max_concurrency=16)(Desk)


class WarmGroups:
    """`with WarmGroups(...) as desks:` starts `count` groups and yields their desk names; on exit the desks
    close, the groups' workers return, and each fit ends, removing its placement group. `starts` then holds
    how many times each group's workers started (1, plus one per restart); `failures[i]` says why group i
    gave up (out of restarts), None while it serves."""

    def __init__(self, the_plan: Plan, folder: Path, count: int, max_failures: int, desk_prefix: str,
                 namespace: str | None = None) -> None:
        self.plan, self.folder, self.max_failures = the_plan, folder, max_failures
        self.names = [f"{desk_prefix}{i}" for i in range(count)]
        self.namespace = namespace
        self.desks: list[Any] = []
        self.threads: list[threading.Thread] = []
        self.starts: list[int] = []
        self.failures: list[str | None] = [None] * count

    def log_dir(self, index: int) -> Path:
        return self.folder / f"group-{index}" / "logs"

    def __enter__(self) -> list[str]:
        here = on_this_node()
        self.desks = [RemoteDesk.options(name=name, namespace=self.namespace, scheduling_strategy=here).remote()
                      for name in self.names]
        ray.get([d.__ray_ready__.remote() for d in self.desks])  # up before any client looks for them
        self.threads = [threading.Thread(target=self._fit, args=(i,), name=f"warm-group-{i}", daemon=True)
                        for i in range(len(self.names))]
        for thread in self.threads:
            thread.start()
        return self.names

    def _fit(self, index: int) -> None:
        run_dir = self.log_dir(index).parent
        args = GroupArgs(desk=self.names[index], namespace=self.namespace, log_dir=str(self.log_dir(index)))
        trainer = make_trainer(group_worker, args, self.plan, run_dir, max_failures=self.max_failures)
        try:
            trainer.fit()
        except Exception as exc:  # out of restarts: the clients waiting on this group fail with the cause
            self.failures[index] = failure_line(exc, [], run_dir)
            why = f"warm group {index} failed: {self.failures[index]}"
            log.error(why)
            self.desks[index].close.remote(why)

    def __exit__(self, *exc: object) -> None:
        for desk in self.desks:
            desk.close.remote("")
        for thread in self.threads:
            thread.join(timeout=120)
        self.starts = ray.get([desk.times_started.remote() for desk in self.desks])
        for desk in self.desks:
            ray.kill(desk)
