"""Ray Train's torch backend (ray.train.torch.TorchConfig) as a config whose module imports no torch.

Ray's TorchConfig lives in a module that imports torch, and the driver builds it, pickles its backend into
the callbacks it hands Train's controller, and the controller unpickles them: two processes that never run a
tensor op import torch (~1.2 s of CPU each) on the path to the first step. Here the controller's side (pick
the backend, hand out the master address, start and end the process group) only names Ray's worker-side
functions; each imports Ray's torch module on the worker, which imports torch anyway. The steps are Ray
2.60's _TorchBackend's for GPUs and CPUs (no TPU here)."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import GetTimeoutError
from ray.train._internal.utils import get_address_and_port
from ray.train.backend import Backend, BackendConfig
from ray.train.v2._internal.util import TrainingFramework

log = logging.getLogger(__name__)
SHUTDOWN_TIMEOUT_ENV, SHUTDOWN_TIMEOUT_S = "TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S", 30  # Ray's, the same


@dataclass
class LeanTorchConfig(BackendConfig):
    """What Ray's TorchConfig holds: the process group's backend (None: nccl with GPUs, else gloo) and the
    timeout of its collectives; workers meet at rank 0's address ("env://")."""

    backend: str | None = None
    timeout_s: int = 1800

    @property
    def backend_cls(self) -> type[Backend]:
        return LeanTorchBackend

    @property
    def train_func_context(self) -> Any:
        return on_the_rank_device

    @property
    def framework(self) -> TrainingFramework:
        return TrainingFramework.TORCH


@contextlib.contextmanager
def on_the_rank_device() -> Iterator[None]:
    """Around every rank's train function, as Ray's: its GPU is CUDA's current device."""
    from ray.train.torch.config import TorchConfigContextManager  # on the worker (imports torch)

    with TorchConfigContextManager():
        yield


def set_master(addr: str, port: int) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = addr, str(port)


def set_distributed_env() -> None:
    """LOCAL_RANK, RANK and the rest, before init_process_group (Ray's, on the worker)."""
    from ray.train.torch.config import _set_torch_distributed_env_vars  # on the worker (imports torch)

    _set_torch_distributed_env_vars()


def start_process_group(**kwargs: Any) -> None:
    from ray.train.torch.config import _setup_torch_process_group  # on the worker (imports torch)

    _setup_torch_process_group(**kwargs)


def end_process_group(destroy_process_group: bool) -> None:
    from ray.train.torch.config import _shutdown_torch  # on the worker (imports torch)

    _shutdown_torch(destroy_process_group=destroy_process_group)


class LeanTorchBackend(Backend):
    share_cuda_visible_devices = True  # as Ray's: a node's ranks see each other's GPUs (NCCL's P2P needs it)

    def on_start(self, worker_group: Any, backend_config: LeanTorchConfig) -> None:
        backend = backend_config.backend
        if backend is None:
            backend = "nccl" if worker_group.get_resources_per_worker().get("GPU", 0) > 0 else "gloo"
        addr, port = worker_group.execute_single(0, get_address_and_port)
        worker_group.execute(set_master, addr=addr, port=port)
        worker_group.execute(set_distributed_env)
        ray.get([worker_group.execute_single_async(
            rank, start_process_group, backend=backend, world_rank=rank, world_size=len(worker_group),
            init_method="env://", timeout_s=backend_config.timeout_s) for rank in range(len(worker_group))])

    def on_shutdown(self, worker_group: Any, backend_config: LeanTorchConfig) -> None:
        ends = worker_group.execute_async(end_process_group, destroy_process_group=len(worker_group) > 1)
        timeout = float(os.environ.get(SHUTDOWN_TIMEOUT_ENV, SHUTDOWN_TIMEOUT_S))
        try:
            ray.get(ends, timeout=timeout)
        except GetTimeoutError:
            log.warning("the torch process group did not end within %.0f s", timeout)
