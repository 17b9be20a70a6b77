"""`orchestrator launch`: check everything, then plan, start (or join) Ray, run the job on a pool of its shape
or on a worker group of its own, and write the run's results. Nothing is written before the config is known
to be good."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from cluster.plan import Plan
from groundwork.errors import ConfigError, Interrupted, RunFailed
from groundwork.localray import in_use
from groundwork.remote import RunPlace, is_uri
from orchestrator.config import LAUNCH_FILE, LaunchConfig, write_launch_config
from orchestrator.launcher.on_pool import run_on_pool
from orchestrator.launcher.results import dedupe_rows, plot_loss, plot_telemetry, read_rows, write_rows
from orchestrator.launcher.summary import write_summary
from orchestrator.preflight import checked_plan
from orchestrator.raytrain.job import Job
from orchestrator.raytrain.session import import_while_ray_starts, ray_session
from orchestrator.warm.pool import find_pool
from trainables.checkpoint import checkpoints_in
from trainables.config import TrainConfig
from trainables.peaks import peak_tflops_of

log = logging.getLogger(__name__)
OWN_GROUP = "orchestrator.launcher.own_group"  # imported as the launch starts an embedded Ray
# The processes a group of its own runs beside its workers: the run's metrics sink and Ray Train's
# synchronization actor, and its controller where that is not in the driver (see Job.controller_in_driver).
# An embedded Ray starts them all as the driver connects (see start_local).
OWN_GROUP_ACTORS = 2
RAY_SNAPSHOT = "checkpoint_manager_snapshot.json"  # Ray Train 2.60 keeps its checkpoint list there
STATE_FILE = "state.json"  # in every run folder that ended: how


@dataclass(frozen=True)
class RunResult:
    name: str
    path: Path
    metrics: dict[str, float]  # the last validation row (a train function's: its last report)
    summary: dict[str, float]  # throughput, MFU, peak memory, utilisation, energy (summary.json)
    checkpoint: Path | None  # the latest checkpoint folder (holds state.pt); None where it is in a bucket
    rows: list[dict[str, float]]
    seconds: float
    workers: str  # where the job ran: the warm pool of a Ray cluster, or a worker group of its own
    stored: str = ""  # where the run folder is kept: `path`, or the URI that `path` is a staging copy of


def prepare_run(cfg: LaunchConfig, the_plan: Plan, resume: bool) -> tuple[LaunchConfig, RunPlace]:
    name = cfg.name or default_name(cfg)
    place = RunPlace.of(the_plan.storage_path, name)
    exists = place.has(LAUNCH_FILE)
    if resume and not exists:
        raise ConfigError(f"--resume {name}: no run at {place.where}: list runs with `ls {the_plan.storage_path}`")
    if not resume and exists:
        raise ConfigError(f"run {name!r} already exists at {place.where}: continue it with --resume {name}"
                          " or choose another --name")
    return cfg.model_copy(update={"name": name}), place


def default_name(cfg: LaunchConfig) -> str:
    """<what runs>-<time>: the built-in model's name, the function of an import path (`mypkg.nets:mlp`: mlp),
    the script's file name (no `:` or `/` to trouble a path)."""
    return f"{cfg.program}-{time.strftime('%Y%m%d-%H%M%S')}"


def launch_job(cfg: LaunchConfig, place: RunPlace, resume: bool, the_plan: Plan | None = None) -> Job:
    """The launch as one job; a resumed one starts from the run's checkpoints, newest first (on a URI the
    workers list them there). The plan fills in what the user left to the cluster spec (see for_plan)."""
    run_dir = place.local
    return Job(name=run_dir.name, train=for_plan(cfg.train, the_plan), kind=cfg.kind, entry=cfg.entry,
               run_dir=str(run_dir), log_dir=str(run_dir / "logs"), user=cfg.user,
               resume=tuple(str(p) for p in checkpoints_in(run_dir)) if resume and not place.uri else (),
               command=script_command(cfg), cwd=os.getcwd(), tee=cfg.tee, max_restarts=cfg.max_failures,
               planned_world=cfg.workers, remote=place.uri)


def for_plan(train: TrainConfig, the_plan: Plan | None) -> TrainConfig:
    """`train` with what the spec decides where the user did not: MFU's peak TFLOP/s from its GPU type (if the
    type is in the table), hsdp's shard group size from its nodes."""
    update: dict[str, float | int] = {}
    gpu_type = the_plan.gpu_type if the_plan else None
    if gpu_type and not train.peak_tflops and (peak := peak_tflops_of(gpu_type, train.precision)):
        update["peak_tflops"] = peak
    if the_plan and the_plan.mesh and train.shard_size is None:
        update["shard_size"] = the_plan.mesh[1]
    return train.model_copy(update=update) if update else train


def script_command(cfg: LaunchConfig) -> tuple[str, ...]:
    """Python's arguments for a script job, as torchrun would pass them; () for other jobs."""
    if cfg.script:
        return (str(Path(cfg.script).resolve()), *cfg.args)
    return ("-m", cfg.module, *cfg.args) if cfg.module else ()


def _on_pool(cfg: LaunchConfig, the_plan: Plan, address: str | None) -> bool:
    """Whether this launch runs on the pool of the cluster it joined (see orchestrator.warm.pool)."""
    if address is None or not find_pool(the_plan):
        return False
    if is_uri(the_plan.storage_path):
        log.warning("a pool keeps its runs in a folder: this launch, whose storage is %s, starts its own workers",
                    the_plan.storage_path)
        return False
    if cfg.kind != "loop":
        log.warning("a pool runs the shared loop: this %s starts its own workers", "script" if
                    cfg.kind == "script" else "train function")
        return False
    return True


def launch(cfg: LaunchConfig, resume: bool = False) -> RunResult:
    """Run one training job to the end and return where its results are."""
    spec, the_plan, address = checked_plan(cfg)
    cfg, place = prepare_run(cfg, the_plan, resume)
    place.start(resume)
    run_dir = place.local
    run_dir.mkdir(parents=True, exist_ok=True)
    write_launch_config(cfg, run_dir / LAUNCH_FILE)
    place.push()  # on a URI at once: a --resume from anywhere finds the run even if this process dies
    if resume:
        set_aside_torn_snapshot(place)
    job = launch_job(cfg, place, resume, the_plan)
    started = time.perf_counter()
    if address is None:
        import_while_ray_starts(OWN_GROUP)
    try:
        # workers under Nsight have a runtime env of their own: a prestarted process cannot serve them
        prestart = OWN_GROUP_ACTORS + (not job.controller_in_driver) + (0 if cfg.nsys else the_plan.workers)
        with in_use(address), ray_session(spec, address, cfg.dashboard, cfg.verbose, the_plan.env, prestart):
            pooled = _on_pool(cfg, the_plan, address)
            if pooled:
                new_rows, checkpoint = run_on_pool(cfg, job, run_dir)
            else:
                from orchestrator.launcher.own_group import fit_own_group  # deferred: see import_while_ray_starts

                new_rows, checkpoint = fit_own_group(cfg, the_plan, job, run_dir)
    except RunFailed as exc:
        raise after_failure(cfg, place, resume, exc) from exc
    except Interrupted as exc:
        keep_rows(run_dir, exc.rows)
        mark(run_dir, "interrupted")
        place.push_after_failure()
        raise
    rows = dedupe_rows(read_rows(run_dir) + new_rows)  # a resumed run appends to what it wrote before
    if rows:
        write_rows(rows, run_dir)
        title = f"{cfg.name}: {cfg.program}, {cfg.workers} worker(s)"
        plot_loss(rows, run_dir, title)
        plot_telemetry(rows, run_dir, title)
    mark(run_dir, "finished")
    summary = write_summary(rows, run_dir)
    place.push()
    if checkpoint is not None and place.uri is not None:
        checkpoint = place.local_checkpoint(str(checkpoint))  # on a bucket: None (it is under place.uri)
    workers = f"the warm pool at {address}" if pooled else (
        f"a group of its own at {address}" if address else "a group of its own on an embedded Ray")
    return RunResult(cfg.name or "", run_dir, last_validation(rows), summary, checkpoint, rows,
                     time.perf_counter() - started, workers, place.where)


def set_aside_torn_snapshot(place: RunPlace) -> None:
    """Ray Train's own record of a run's checkpoints, cut short (a full disk, a kill while it was written),
    stops its controller from starting; the run's checkpoints are found without it (each by its manifest).
    On a URI it is the copy there that Ray Train reads."""
    try:
        json.loads(place.read(RAY_SNAPSHOT))
    except FileNotFoundError:
        return
    except ValueError:
        log.warning("%s in %s is cut short: set aside; the checkpoints are read from the run folder",
                    RAY_SNAPSHOT, place.where)
        place.move(RAY_SNAPSHOT, f"{Path(RAY_SNAPSHOT).stem}.torn")


def keep_rows(run_dir: Path, rows: list[dict[str, float]]) -> None:
    """The rows of a run that did not finish, beside those it wrote before (a storage that is full keeps
    what it has: the run's own error says why)."""
    with contextlib.suppress(OSError):
        write_rows(dedupe_rows(read_rows(run_dir) + rows), run_dir)


def mark(run_dir: Path, state: str) -> None:
    """How the run ended, in run_dir/state.json: "finished", "failed" or "interrupted" (then `--resume`)."""
    with contextlib.suppress(OSError):
        (run_dir / STATE_FILE).write_text(json.dumps({"state": state, "at": time.strftime("%Y-%m-%d %H:%M:%S")}))


def after_failure(cfg: LaunchConfig, place: RunPlace, resume: bool, exc: RunFailed) -> RunFailed:
    """A failed run keeps the rows it made (metrics.parquet). One that made none and has no checkpoint never
    trained: its folder goes (a rerun under the same name is not refused), its logs moved to a temporary
    folder that the error line names. A script's folder stays: its logs are what it leaves."""
    run_dir = place.local
    if exc.rows:
        keep_rows(run_dir, exc.rows)
        mark(run_dir, "failed")
        place.push_after_failure()
        return exc
    if resume or cfg.kind == "script" or has_checkpoints(place):
        place.push_after_failure()
        return exc
    kept = Path(tempfile.mkdtemp(prefix=f"orchestrator-{run_dir.name}-"))
    if (run_dir / "logs").is_dir():
        shutil.move(run_dir / "logs", kept / "logs")
    place.remove()
    line = str(exc).replace(str(run_dir / "logs"), str(kept / "logs"))
    return RunFailed(f"{line}; it never trained, so {place.where} was removed")


def has_checkpoints(place: RunPlace) -> bool:
    try:
        return bool(place.checkpoints())
    except OSError:  # a storage that does not answer: keep what may be there
        return True


def last_validation(rows: list[dict[str, float]]) -> dict[str, float]:
    """The newest row that holds a validation metric, else the newest row (a function may report none)."""
    return next((r for r in reversed(rows) if r.get("val_loss") is not None or r.get("val_acc") is not None),
                rows[-1] if rows else {})
