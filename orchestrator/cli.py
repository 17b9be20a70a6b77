"""`orchestrator`: launch, plan, sweep, doctor, cluster, pool, top, jobs, up, down. Bad input is one line on stderr and
exit code 2.

Each command imports what it needs when it runs (the imports marked `deferred: per command`): parsing the
flags and refusing a bad one needs neither torch nor Ray, which take seconds to import."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

import yaml
from rich.console import Console
from rich.table import Table

from cluster.launcher import render
from cluster.plan import plan
from cluster.spec import ClusterSpec, load_spec
from groundwork.errors import ConfigError, RunFailed
from groundwork.remote import is_uri
from groundwork.yamlio import parse_value
from orchestrator.admin.doctor import doctor, print_pairs
from orchestrator.admin.nodes import down, up
from orchestrator.config import LaunchConfig, resolve_launch
from orchestrator.flags import add_model_flags, overrides_from
from orchestrator.raytrain.auth import present_token
from orchestrator.sweeps.config import SweepConfig
from trainables.config import TrainConfig

EXIT_BAD_INPUT = 2
EXIT_RUN_FAILED = 1
POOL_FIELDS = ("address", "cluster", "workers", "gpus_per_worker", "cpus_per_worker", "placement", "node_group")


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (no usage dump), still exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _launch_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="a launch YAML (e.g. a sweep's best.yaml); flags override it")
    parser.add_argument("--resume", metavar="RUN", help="continue run RUN from its latest checkpoint")
    add_model_flags(parser, TrainConfig, prefix="o.train.")
    add_model_flags(parser, LaunchConfig, prefix="o.", skip=("train", "user", "args", "min_workers"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="user_settings",
                        help="one of your own settings (repeatable), typed as YAML reads it: --set hidden=64")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="orchestrator", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    launch = sub.add_parser("launch", help="train one model on Ray Train (embedded local Ray by default)")
    _launch_flags(launch)
    launch.add_argument("--detach", action="store_true", help="submit the launch to the cluster as a Ray job and"
                        " return at once: it runs on when this terminal closes (see `orchestrator jobs`)")
    _launch_flags(sub.add_parser("plan", help="print the plan a launch would use, start nothing"))
    sweep = sub.add_parser("sweep", help="hyperparameter sweep: Ray Tune over full Ray Train runs")
    sweep.add_argument("--config", help="a sweep YAML (see --schema)")
    sweep.add_argument("--resume", metavar="NAME", help="continue sweep NAME; finished trials are kept")
    sweep.add_argument("--schema", action="store_true", help="print the sweep YAML's JSON Schema and exit")
    sweep.add_argument("--quiet", action="store_true", help="no live trial table")
    sweep.add_argument("--detach", action="store_true", help="submit the sweep to the cluster as a Ray job and"
                       " return (follow it with `orchestrator jobs`)")
    doctor = sub.add_parser("doctor", help="torch/CUDA/NCCL/Ray versions, devices, cluster resources")
    doctor.add_argument("--address")
    doctor.add_argument("--no-ray", action="store_true", help="skip starting/joining Ray")
    cluster = sub.add_parser("cluster", help="cluster specs").add_subparsers(dest="cluster_command", required=True)
    validate = cluster.add_parser("validate", help="check a cluster YAML and print what it describes")
    validate.add_argument("spec")
    render = cluster.add_parser("render", help="write a Ray cluster-launcher YAML (for `ray up`) from a spec")
    render.add_argument("spec")
    render.add_argument("-o", "--output", help="file to write (default: stdout)")
    up = cluster.add_parser("up", help="start the spec's nodes as real Ray nodes on this machine (127.0.0.1)")
    up.add_argument("spec")
    up.add_argument("--port", type=int, help="the head's port (default: the spec's address's, else 6390)")
    cluster.add_parser("down", help="stop the nodes `cluster up` started")
    check = cluster.add_parser("check", help="compare a spec with the live cluster; all-reduce bandwidth")
    check.add_argument("spec")
    check.add_argument("--address", help="Ray cluster to check (default: the spec's address)")
    top = sub.add_parser("top", help="every node's CPU and memory and every GPU's use, power and memory (NVML)")
    top.add_argument("--address", help="Ray cluster to read (default: the spec's address, else this machine)")
    top.add_argument("--cluster", help="cluster spec YAML (default: this machine)")
    top.add_argument("--once", action="store_true", help="print one table and exit (default: refresh until Ctrl-C)")
    jobs = sub.add_parser("jobs", help="detached runs on a cluster: list, status, logs [-f], stop, wait")
    jobs.add_argument("action", choices=("list", "status", "logs", "stop", "wait"))
    jobs.add_argument("run", nargs="?", help="a run name or Ray job id (all but list)")
    jobs.add_argument("--address", help="the cluster (default: the spec's address, else `cluster up`'s)")
    jobs.add_argument("--cluster", help="cluster spec YAML whose address to use")
    jobs.add_argument("-f", "--follow", action="store_true", help="logs: stream until the job ends")
    pool = sub.add_parser("pool", help="keep a worker group warm on a running cluster for launches that join it")
    pool_sub = pool.add_subparsers(dest="pool_command", required=True, parser_class=OneLineParser)
    pool_up = pool_sub.add_parser("up", help="start the pool's workers (the shape of the launches to run on it)")
    add_model_flags(pool_up, LaunchConfig, prefix="o.", skip=tuple(set(LaunchConfig.model_fields) - set(POOL_FIELDS)))
    pool_down = pool_sub.add_parser("down", help="stop the pool's workers (a running job ends first)")
    pool_down.add_argument("--address", required=True)
    standing = sub.add_parser("up", help="a local Ray with a warm pool that launches with no --address run on,"
                              " until `orchestrator down` or the idle timeout")
    add_model_flags(standing, LaunchConfig, prefix="o.",
                    skip=tuple(set(LaunchConfig.model_fields) - set(POOL_FIELDS)) + ("address",))
    standing.add_argument("--idle-timeout", type=float, default=3600.0, metavar="SECONDS",
                          help="end it after this long with no launch on it (default: 3600)")
    sub.add_parser("down", help="end what `orchestrator up` started")
    return parser


def cmd_top(args: argparse.Namespace) -> int:
    from orchestrator.admin.top import top  # deferred: imports Ray
    from orchestrator.raytrain.session import ray_session  # deferred: imports Ray

    spec = load_spec(args.cluster)
    with ray_session(spec, args.address or spec.address, verbose=False):
        top(args.once)
    return 0


def user_settings(pairs: list[str]) -> dict[str, Any]:
    """`--set key=value` flags as a mapping, each value typed as YAML reads it."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {pair!r}: write KEY=VALUE, e.g. --set hidden=64")
        out[key.strip()] = parse_value(value, f"--set {key.strip()}")
    return out


def _config_from(args: argparse.Namespace) -> LaunchConfig:
    overrides = overrides_from(args, "o.")
    if args.user_settings:
        overrides["user"] = user_settings(args.user_settings)
    if args.script_args is not None:
        overrides["args"] = args.script_args
    return resolve_launch(overrides, args.config, args.resume)


def cmd_launch(args: argparse.Namespace) -> int:
    cfg = _config_from(args)  # first: a bad setting is refused before torch and Ray are imported
    if args.detach:
        return detached_launch(cfg, args.resume is not None)
    from orchestrator.launcher.launch import launch  # deferred: per command (imports torch and Ray)
    from orchestrator.launcher.summary import summary_lines  # deferred: with launch

    result = launch(cfg, resume=args.resume is not None)
    shown = [k for k in ("val_acc", "val_loss", "loss") if k in result.metrics] or [
        k for k in result.metrics if k not in ("report", "step", "epoch")][:4]  # a function's own metrics
    metrics = ": " + ", ".join(f"{k}={result.metrics[k]:.4g}" for k in shown) if shown else ""
    details = "".join(f"\n  {line}" for line in summary_lines(result.summary))
    Console(stderr=True, width=200).print(
        f"[bold green]run {result.name}[/] done in {result.seconds:.1f} s{metrics}{details}\n"
        f"  workers: {result.workers}\n  results: {result.stored or result.path}", soft_wrap=True, highlight=False)
    return 0


def detached_launch(cfg: LaunchConfig, resume: bool) -> int:
    from orchestrator.jobs.submit import detach  # deferred: per command (imports torch and Ray)

    job_id, name, run_dir = detach(cfg, resume)
    print_submitted("run", name, job_id, run_dir)
    return 0


def print_submitted(what: str, name: str, job_id: str, folder: str) -> None:
    print(f"{what} {name} submitted as job {job_id}; results: {folder}\n  follow: orchestrator jobs logs {name} -f"
          f"\n  stop: orchestrator jobs stop {name}  (then --resume {name} continues it)")


def cmd_jobs(args: argparse.Namespace) -> int:
    if args.action != "list" and not args.run:
        raise ConfigError(f"jobs {args.action} needs a run name or job id: see `orchestrator jobs list`")
    address = args.address or (load_spec(args.cluster).address if args.cluster else None)
    from orchestrator.jobs.client import default_address, jobs_api, jobs_client  # deferred: imports Ray
    from orchestrator.jobs.control import act  # deferred: as above

    address = default_address(address)
    client = jobs_client(address)
    with jobs_api(address):
        return act(client, args.action, args.run, args.follow)


def cmd_sweep(args: argparse.Namespace) -> int:


    if args.schema:
        print(json.dumps(SweepConfig.model_json_schema(), indent=2))
        return 0

    if args.detach:
        from orchestrator.jobs.submit import detach_sweep  # deferred: per command (imports torch and Ray)

        job_id, name, folder = detach_sweep(args.config, args.resume)
        print_submitted("sweep", name, job_id, folder)
        return 0
    from orchestrator.sweeps.sweep import sweep  # deferred: per command (imports Ray)

    result = sweep(args.config, resume=args.resume, quiet=args.quiet)
    Console(stderr=True).print(
        f"[bold green]sweep {result.name}[/] done in {result.seconds:.1f} s: best {result.best_metric:.4g}\n"
        f"  results: {result.path}\n  launch the best: orchestrator launch --config {result.path / 'best.yaml'}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:

    cfg = _config_from(args)
    the_plan = plan(load_spec(cfg.cluster), cfg.job_request())
    print_pairs("plan", the_plan.describe())
    if cfg.train.strategy == "model-parallel":
        _print_stages(cfg, max(1, int(the_plan.gpus_per_worker)))
    return 0


def _print_stages(cfg: LaunchConfig, devices_per_worker: int) -> None:

    from trainables.data import build_datasets  # deferred: per command (imports torch)
    from trainables.models import model_entry  # deferred: per command (imports torch)
    from trainables.parallel.pipeline import estimate_stages  # deferred: per command (imports torch)

    t = cfg.train
    _, _, meta = build_datasets(t, t.dataset or model_entry(t.model).default_dataset)
    stages = t.stages or devices_per_worker
    title = f"{t.model}: {stages} stages, {t.micro_batches} micro-batches of {t.batch_size // t.micro_batches}"
    table = Table("stage", "device", "layers", "parameters", "activations (fp32)", title=title)
    for i, est in enumerate(estimate_stages(t.model, meta, stages, t.micro_batches, t.batch_size, t.split)):
        first, n = est.info.first_layer, est.info.layers
        table.add_row(str(i), f"device {i % devices_per_worker}", f"{first}..{first + n - 1} ({n})",
                      f"{est.info.parameters / 1e6:.2f}M", f"{est.activation_bytes / 2**20:,.1f} MiB")
    Console().print(table)


def cmd_pool(args: argparse.Namespace) -> int:
    if args.pool_command == "down":
        from orchestrator.warm.pool import pool_down  # deferred: per command (imports Ray)

        pool_down(args.address)
        print(f"the warm pool at {args.address} is down")
        return 0
    cfg = resolve_launch(overrides_from(args, "o."))  # first: a bad setting is refused before any import
    from orchestrator.preflight import checked_plan  # deferred: per command (imports torch)
    from orchestrator.warm.pool import pool_up  # deferred: per command (imports Ray)

    _, the_plan, address = checked_plan(cfg)
    refuse_uri_for_pools(the_plan.storage_path)
    if address is None:
        raise ConfigError("a warm pool lives on a running Ray cluster: pass --address (start one on this machine"
                          " with `orchestrator cluster up`)")
    info, seconds = pool_up(the_plan, address)
    print(f"warm pool up at {address} in {seconds:.1f} s: {info.shape.workers} workers x"
          f" {info.shape.resources_per_worker}; launches with --address {address} of this shape run on it"
          f" (logs: {info.log_dir})")
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    if not 0 < args.idle_timeout < math.inf:
        raise ConfigError(f"--idle-timeout {args.idle_timeout:g}: give the seconds it may stay idle, > 0")
    cfg = resolve_launch(overrides_from(args, "o."))  # first: a bad setting is refused before any import
    from orchestrator.admin import local_up  # deferred: per command
    from orchestrator.preflight import checked_plan  # deferred: per command (imports torch)

    local_up.check_one_node(load_spec(cfg.cluster))  # before checked_plan, which would ask for an --address
    spec, the_plan, _ = checked_plan(cfg)
    refuse_uri_for_pools(the_plan.storage_path)
    address, log_dir, seconds = local_up.start(spec, the_plan, args.idle_timeout)
    print(f"up at {address} in {seconds:.1f} s with a warm pool of {the_plan.workers} workers: launches with no"
          f" --address run there; `orchestrator down` ends it (else {args.idle_timeout:g} s idle do; pool logs:"
          f" {log_dir})")
    return 0


def refuse_uri_for_pools(storage: str) -> None:
    if is_uri(storage):
        raise ConfigError(f"a warm pool keeps its runs in a folder, and storage {storage} is a URI: set storage.path"
                          " to a folder for the pool (launches with a URI start their own workers)")


def cmd_down(args: argparse.Namespace) -> int:
    from orchestrator.admin import local_up  # deferred: per command

    print(f"stopped the local Ray at {local_up.stop()}")
    return 0


def cmd_cluster(args: argparse.Namespace) -> int:

    if args.cluster_command == "down":

        print(f"stopped the local cluster at {down()}")
        return 0
    spec = load_spec(args.spec)
    if args.cluster_command == "render":
        return _render(spec, args.output)
    if args.cluster_command == "check":
        return _check(spec, args.address or spec.address)
    if args.cluster_command == "up":
        port = args.port or (int(spec.address.rsplit(":", 1)[1]) if spec.address else 6390)
        print(f"{spec.num_nodes} Ray nodes up; join with --address {up(spec, port)}")
        return 0
    rows = [("name", spec.name), ("address", spec.address or "(embedded local Ray)"),
            ("nodes", str(spec.num_nodes)), ("CPUs", str(spec.total_cpus)), ("GPUs", str(spec.total_gpus))]
    rows += [(f"group {g.name}", f"{g.count} x ({g.cpus} CPU, {g.gpus.count} GPU {g.gpus.type or ''})".rstrip())
             for g in spec.node_groups]

    print_pairs(f"cluster {args.spec}", rows)
    return 0


def _check(spec: ClusterSpec, address: str | None) -> int:
    if address is None:
        raise ConfigError("cluster check needs a live cluster: pass --address or set address: in the spec")
    import ray  # deferred: per command

    from orchestrator.admin.check import check  # deferred: per command (imports Ray)
    from orchestrator.raytrain.session import join  # deferred: per command (imports Ray)

    join(address)
    try:
        findings, bandwidth = check(spec)
    finally:
        ray.shutdown()
    console = Console()
    table = Table("check", "expected", "found", "", title=f"cluster check: {spec.name} at {address}")
    for f in findings:
        table.add_row(f.what, f.expected, f.found, "[green]ok[/]" if f.ok else "[bold red]FAIL[/]")
    console.print(table)
    if bandwidth:
        bw = Table("message", "time", "bus bandwidth", title="all-reduce across all nodes")
        for size, seconds, bus in bandwidth:
            bw.add_row(f"{size / 1024:,.0f} KiB", f"{seconds * 1e3:.3f} ms", f"{bus * 1e3:,.2f} MB/s")
        console.print(bw)
    failed = [f.what for f in findings if not f.ok]
    if failed:
        print(f"orchestrator: cluster check failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def _render(spec: ClusterSpec, output: str | None) -> int:

    from ray.autoscaler._private.util import validate_config  # deferred: per command (imports Ray)


    try:
        config = render(spec)
    except ValueError as exc:
        raise ConfigError(f"cluster render: {exc}") from None
    validate_config(config)  # Ray's own schema: what `ray up` will accept
    text = yaml.safe_dump(config, sort_keys=False)
    if output:
        tmp = Path(output).with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(output)
    else:
        print(text, end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    present_token()  # before anything imports ray
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does: the user's own modules import from here
    argv = sys.argv[1:] if argv is None else argv
    # `launch --script train.py -- --lr 0.1`: what follows `--` is the script's, not ours
    script_args = argv[argv.index("--") + 1:] if "--" in argv else None
    args = build_parser().parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    args.script_args = script_args
    try:
        if args.command == "doctor":
            return doctor(args.address, with_ray=not args.no_ray)
        commands = {"launch": cmd_launch, "plan": cmd_plan, "cluster": cmd_cluster, "sweep": cmd_sweep,
                    "pool": cmd_pool, "top": cmd_top, "jobs": cmd_jobs, "up": cmd_up, "down": cmd_down}
        return commands[args.command](args)
    except ConfigError as exc:
        print(f"orchestrator: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except RunFailed as exc:
        print(f"orchestrator: run failed: {exc}", file=sys.stderr)
        return EXIT_RUN_FAILED
    except KeyboardInterrupt as exc:
        run = getattr(exc, "run", None)  # an Interrupted launch names its run
        more = f": every rank stopped; continue with --resume {run}" if run else ""
        print(f"orchestrator: interrupted{more}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
