"""Join a Ray cluster, or start an embedded one on this machine: bound to 127.0.0.1, token auth on (as Ray
2.60 sets it for local clusters, the token made first where there is none), dashboard off unless asked for."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator

from cluster.plan import group_resource
from cluster.spec import ClusterSpec
from groundwork.address import wait_reachable
from groundwork.localray import started_here

log = logging.getLogger(__name__)

# How often Ray Train's controller polls the workers: it notices a finished (or failed) group only then. Ray's
# default, 2 s, adds ~1 s on average to the end of every run and of every warm group; a poll is one small RPC
# per worker. Ray passes the variable on to the controller.
HEALTH_CHECK_ENV, HEALTH_CHECK_S = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2"
# What Ray Train sets for its controller (Ray 2.60's default), set here before an embedded Ray starts, so
# that every process of it has it already (see embedded_env).
WARN_BLOCKING_ENV, WARN_BLOCKING = "RAY_WARN_BLOCKING_GET_INSIDE_ASYNC", "0"
# How Ray's processes retry a connection to a local socket: Ray 2.60 sleeps 1 s between 10 attempts, and the
# raylet's first attempt at its own object store can come before the store's thread listens (a second lost
# in 1 of 3 to 8 starts here); 100 ms between 100 attempts keeps the 10 s.
PROMPT_CONNECT = {"RAY_raylet_client_connect_timeout_milliseconds": "100",
                  "RAY_raylet_client_num_connect_attempts": "100"}
# Ray's task events (every task's and actor's state changes, sent to the GCS each second) feed the State API
# and the dashboard's views, which an embedded Ray without --dashboard does not serve; and ray.shutdown waits
# for the driver's last batch (0.28 s of 0.31 s measured for a small session, ~0.5 s after a sweep). Off there.
NO_TASK_EVENTS = {"RAY_task_events_report_interval_ms": "0"}
RAYLET_START_S = 30  # how long ray.init waits for the raylet it started to register (Ray 2.60's, in Node)
# How many worker processes the raylet of an embedded Ray starts at a time. Ray's cap is one per CPU, against
# a storm of task workers; a launch needs a few processes at the same moment (its training workers and Ray
# Train's synchronization actor), and on 2 CPUs the second worker waited for the actor's process to start.
STARTING_AT_ONCE = 8
SOFT_LIMIT_ENV = "RAY_num_workers_soft_limit"  # idle worker processes the raylet keeps (Ray's: one per CPU)
# The node start_local started and the environment its processes inherit from this driver.
_embedded: tuple[object, dict[str, str]] | None = None


def embedded_env() -> dict[str, str] | None:
    """The environment every process of the Ray this driver started was started with; None on a Ray it
    joined, or none. Variables that hold there need no runtime env, and an actor without one can take a
    worker process Ray prestarted (one per CPU, started as the driver connects) rather than wait for a new
    one to start and import Ray."""
    if _embedded is None or _embedded[0] is not ray._private.worker._global_node:  # Ray 2.60: this driver's node
        return None
    return _embedded[1]


from orchestrator.raytrain.auth import present_token  # noqa: E402 (sits with its call, before ray)

present_token()
import ray  # noqa: E402  (after present_token, on purpose)
from ray._private import node as ray_node  # noqa: E402  (Ray 2.60's head start: see skipped_head_parts)
from ray._private import ray_constants  # noqa: E402
from ray._private import services as ray_services  # noqa: E402  (Ray 2.60's node lookup: see get_node_promptly)
from ray._private import utils as ray_utils  # noqa: E402  (Ray 2.60's dashboard check: see skipped_head_parts)
from ray._private.authentication import authentication_token_setup as ray_auth  # noqa: E402  (Ray 2.60)
from ray._raylet import GcsClient, NodeID  # noqa: E402
from ray.core.generated.gcs_pb2 import GcsNodeInfo  # noqa: E402
from ray.core.generated.gcs_service_pb2 import GetAllNodeInfoRequest  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

from orchestrator.raytrain.auth import ensure_token, warn_if_open  # noqa: E402


def bind_to_loopback() -> None:
    """Make Ray use 127.0.0.1 as this node's address (it swaps 127.0.0.1 for the LAN address otherwise).

    Ray does this itself on macOS/Windows, keyed on RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER; the env var reaches
    processes Ray starts, and the constant covers a driver that had already imported Ray."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


def token_on() -> None:
    """Token auth for the Ray this process starts, with the token made first where there is none (a fresh
    machine; Ray would make it readable by all, and say so in a WARNING line). RAY_AUTH_MODE=disabled, set
    by the user, is left as it is."""
    mode = os.environ.get(ray_auth.AUTH_MODE_ENV_VAR)
    if mode and mode.lower() != "token":
        return
    ensure_token()
    if not mode:
        ray_auth._enable_token_auth()  # RAY_AUTH_MODE=token and Ray's config re-read, as ray.init's default does


def start_local(spec: ClusterSpec, dashboard: bool = False, verbose: bool = True,
                worker_env: dict[str, str] | None = None, processes: int = 0) -> None:
    """Ray on this machine for this driver. Every process of it starts with `worker_env` (a launch's plan:
    its NCCL/gloo variables) and with the driver's working directory first on PYTHONPATH, as `python -m`
    has it on the driver's path: workers that need no more get no runtime env (see held_env_only).
    `processes`: the worker processes the job will use (its actors), started as the driver connects and
    kept until used (see prestarting); Ray's own is one per CPU."""
    head = spec.head
    bind_to_loopback()
    # One node that no cloud can reclaim: Ray Train's preemption watcher (an actor, a process per launch,
    # polling every 5 s) has nothing to watch. Ray passes this variable on to the Train controller.
    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    os.environ.setdefault(HEALTH_CHECK_ENV, HEALTH_CHECK_S)
    os.environ.setdefault(WARN_BLOCKING_ENV, WARN_BLOCKING)
    token_on()
    here = os.pathsep.join([os.getcwd(), *filter(None, [os.environ.get("PYTHONPATH")])])
    started = time.perf_counter()
    stand_ins = [(ray_services, "get_node", get_node_promptly),
                 *([(ray_services, "start_ray_process", prestarting(processes))] if processes > head.cpus else [])]
    kept_idle = {SOFT_LIMIT_ENV: str(processes)} if processes > head.cpus and SOFT_LIMIT_ENV not in os.environ else {}
    quiet_tasks = {} if dashboard else {name: value for name, value in NO_TASK_EVENTS.items() if name not in os.environ}
    with environment({**(worker_env or {}), **PROMPT_CONNECT, **kept_idle, **quiet_tasks, "PYTHONPATH": here}) as env, \
            replaced([*skipped_head_parts(dashboard, verbose), *stand_ins]):
        ray.init(
            num_cpus=head.cpus,
            num_gpus=head.gpus.count,
            resources={group_resource(head.name): 1000.0},
            include_dashboard=dashboard,
            dashboard_host="127.0.0.1",
            _node_ip_address="127.0.0.1",
            log_to_driver=verbose,
            logging_level=logging.INFO if verbose else logging.WARNING,  # ray.init sets its logger's level itself
        )
    log.info("embedded Ray started in %.1f s", time.perf_counter() - started)
    global _embedded
    _embedded = (ray._private.worker._global_node, env)


def skipped_head_parts(dashboard: bool, verbose: bool) -> list[tuple[object, str, object]]:
    """What a Ray head starts that a Ray of one launch's own has no use for, as (owner, attribute, stand-in)
    for ray.init, which has no switch for them (Ray 2.60's Node methods and its dashboard check):
    - the autoscaler monitor: a local Ray has nothing to scale (and Ray waits a second for the monitor to exit
      at ray.shutdown, as it answers SIGTERM by calling the GCS that is gone by then);
    - without --dashboard, the API server: the dashboard head, which ray.init waits for (it polls for its URL)
      and which then serves usage stats (off) and the Jobs and State APIs (used on `cluster up` and `up`
      clusters, which start their own); and the check for the dashboard's packages, which imports aiohttp
      and OpenTelemetry in this driver (0.46 s) to choose the dashboard agent's full mode (its HTTP server)
      over the minimal one;
    - when quiet, the log monitor: it forwards the workers' output to the driver, which asked for none."""
    parts: list[tuple[object, str, object]] = [(ray_node.Node, "start_monitor", nothing)]
    if not dashboard:
        no_dashboard = ImportError("no dashboard on a Ray of one launch's own (see orchestrator launch --dashboard)")
        parts += [(ray_node.Node, "start_api_server", nothing),
                  (ray_utils, "get_dashboard_dependency_error", lambda: no_dashboard)]
    if not verbose:
        parts.append((ray_node.Node, "start_log_monitor", nothing))
    return parts


_ray_get_node = ray_services.get_node


def get_node_promptly(gcs_address: str, node_id: str) -> dict:
    """Ray 2.60's services.get_node (which ray.init calls right after it starts the raylet), once the GCS
    lists that node alive. Ray's asks the GCS and, should the raylet not have registered yet (it waits for
    its agents to start: ~1 s on 2 cores), sleeps a whole second before it asks again; this asks every
    20 ms. Past RAYLET_START_S it leaves the waiting, and the error, to Ray's."""
    gcs = GcsClient(address=gcs_address)
    this_node = [GetAllNodeInfoRequest.NodeSelector(node_id=NodeID.from_hex(node_id).binary())]
    deadline = time.monotonic() + RAYLET_START_S
    while time.monotonic() < deadline:
        if gcs.get_all_node_info(timeout=RAYLET_START_S, node_selectors=this_node,
                                 state_filter=GcsNodeInfo.GcsNodeState.ALIVE):
            break
        time.sleep(0.02)
    return _ray_get_node(gcs_address, node_id)


def prestarting(processes: int, start_ray_process: Callable[..., object] | None = None) -> Callable[..., object]:
    """Ray 2.60's services.start_ray_process, the raylet's command changed: `processes` worker processes
    started as the first driver connects (Ray's: one per CPU), and up to STARTING_AT_ONCE of them (or all)
    starting at once. A launch's actors then find a process started and Ray imported while the driver went
    on (~0.5 s of CPU each), rather than wait for one. The raylet kills an idle worker beyond its soft limit
    (one per CPU) after a second: start_local raises that limit with the count."""
    start_ray_process = start_ray_process or ray_services.start_ray_process
    flags = {"--num_prestart_python_workers=": processes,
             "--maximum_startup_concurrency=": max(processes, STARTING_AT_ONCE)}

    def changed(part: str) -> str:
        flag = next((flag for flag in flags if part.startswith(flag)), None)
        return f"{flag}{flags[flag]}" if flag else part

    def start(command: list[str], process_type: str, *args, **kwargs) -> object:
        if process_type == ray_constants.PROCESS_TYPE_RAYLET:
            command = [changed(part) for part in command]
        return start_ray_process(command, process_type, *args, **kwargs)
    return start


@contextlib.contextmanager
def environment(extra: dict[str, str]) -> Iterator[dict[str, str]]:
    """This process's environment with `extra` set, for the length of the block (ray.init hands its
    processes the environment it runs in); yields the whole of it."""
    saved = {name: os.environ.get(name) for name in extra}
    os.environ.update(extra)
    try:
        yield dict(os.environ)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def nothing(*args: object, **kwargs: object) -> None:
    """A stand-in (for `replaced`) that does nothing, whatever it is called with."""
    return None


@contextlib.contextmanager
def replaced(parts: list[tuple[object, str, object]]) -> Iterator[None]:
    """Each owner's attribute replaced by its stand-in for the length of the block (a class's as it is in its
    body: a staticmethod or a property put back as such)."""
    saved = [(owner, name, inspect.getattr_static(owner, name)) for owner, name, _ in parts]
    for owner, name, stand_in in parts:
        setattr(owner, name, stand_in)
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def join(address: str, verbose: bool = True) -> None:
    """Connect this driver to a running cluster (token: see present_token); warn if it takes anyone."""
    wait_reachable(address)
    if not started_here(address):  # ours run with token auth: the probe (a Python process, ~0.5 s) is for others
        warn_if_open(address)
    if address.split(":")[0] in ("127.0.0.1", "localhost"):
        bind_to_loopback()  # a `cluster up` cluster: this driver's node is 127.0.0.1 too
    ray.init(address=address, log_to_driver=verbose, logging_level=logging.INFO if verbose else logging.WARNING)


@contextlib.contextmanager
def ray_session(spec: ClusterSpec, address: str | None, dashboard: bool = False,
                verbose: bool = True, worker_env: dict[str, str] | None = None, processes: int = 0) -> Iterator[None]:
    """Ray for the length of a launch. A Ray this process already holds is reused and left running. Not
    `verbose`: the workers' output stays in their log files (Ray forwards none of it) and Ray's own INFO lines
    on this driver are not printed, so the terminal holds the run's bar, lines and errors. An embedded Ray
    starts every process with `worker_env` and `processes` worker processes at once (see start_local)."""
    with driver_logs(verbose):
        if ray.is_initialized():
            yield
            return
        if address is None:
            start_local(spec, dashboard, verbose, worker_env, processes)
        else:
            join(address, verbose)
        try:
            yield
        finally:
            ray.shutdown()


@contextlib.contextmanager
def driver_logs(verbose: bool) -> Iterator[None]:
    """Ray's INFO lines on this driver ("Started a local Ray instance", the trainer's) only when verbose."""
    ray_log = logging.getLogger("ray")
    level = ray_log.level
    if not verbose:
        ray_log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        ray_log.setLevel(level)


def on_this_node() -> NodeAffinitySchedulingStrategy:
    """Where the driver's own actors go (a run's sink, a sweep's desks and registry): on the driver's node,
    which lives as long as the driver does. Anywhere else, losing that node (what an elastic run survives)
    would take the run's bookkeeping with it."""
    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)


def import_while_ray_starts(module: str) -> None:
    """Import `module` on a thread while this one starts Ray: ray.init waits ~1 s for the raylet it started,
    on cores that are mostly idle (a launch's own group imports Ray Train, ~0.8 s; a sweep's plot of its
    results, matplotlib, ~0.6 s). The import statement that needs it waits for the thread's, as Python's
    import locks make any second importer of a module wait; should the thread's fail, that statement
    imports it itself."""
    def quietly() -> None:
        try:
            importlib.import_module(module)
        except Exception as exc:  # the import statement that needs it raises it again
            log.debug("importing %s ahead failed: %s", module, exc)

    threading.Thread(target=quietly, name=f"import {module}", daemon=True).start()
