"""`orchestrator sweep`: validate the sweep YAML, then run it on the embedded local Ray or --address."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from groundwork.errors import ConfigError
from groundwork.plots import FIGURE_MODULE
from groundwork.tensorboard import WRITER_MODULE
from groundwork.yamlio import read_yaml, validate_doc
from orchestrator.preflight import checked_plan
from orchestrator.raytrain.session import import_while_ray_starts, ray_session
from orchestrator.sweeps.config import SweepConfig
from orchestrator.sweeps.results import write_results
from orchestrator.sweeps.tuner import SweepResult, run_sweep

SWEEPS_DIR = "sweeps"
SWEEP_FILE = "sweep.yaml"


def load_sweep_config(path: str | Path) -> SweepConfig:
    return validate_doc(SweepConfig, read_yaml(path))


def sweep_folder(cfg: SweepConfig, resume: str | None) -> tuple[SweepConfig, Path]:
    """The sweep's name and folder. A resumed sweep's folder was found by sweep_to_submit, which runs first."""
    name = resume or cfg.name or f"sweep-{time.strftime('%Y%m%d-%H%M%S')}"
    folder = (Path.cwd() / SWEEPS_DIR / name).resolve()
    if not resume and (folder / SWEEP_FILE).exists():
        raise ConfigError(f"sweep {name!r} already exists at {folder}: continue it with --resume {name}")
    return cfg.model_copy(update={"name": name}), folder


def sweep_to_submit(config: str | Path | SweepConfig | None, resume: str | None) -> SweepConfig:
    """The sweep a --config or a --resume names (a resumed one must be there: see sweep_folder)."""
    if resume:
        saved = Path.cwd() / SWEEPS_DIR / resume / SWEEP_FILE
        if not saved.exists():
            raise ConfigError(f"--resume {resume}: no sweep at {saved.parent}: list sweeps with `ls {SWEEPS_DIR}`")
        return load_sweep_config(saved)
    if config is None:
        raise ConfigError("sweep needs --config FILE (or --resume NAME)")
    return config if isinstance(config, SweepConfig) else load_sweep_config(config)


def sweep(config: str | Path | SweepConfig | None = None, resume: str | None = None,
          quiet: bool = False) -> SweepResult:
    """Run (or, with resume=NAME, continue) a sweep and write its results; returns a SweepResult."""
    cfg = sweep_to_submit(config, resume)
    spec, the_plan, address = checked_plan(cfg.base)  # refuse a base launch that could never run, first
    cfg, folder = sweep_folder(cfg, resume)
    if not resume:
        folder.mkdir(parents=True)
        (folder / SWEEP_FILE).write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    for module in (FIGURE_MODULE, WRITER_MODULE):  # for the results written at the end (see write_results)
        import_while_ray_starts(module)
    # quiet: no live table, and the workers' output stays in their log files, as for `launch --quiet`
    with ThreadPoolExecutor(max_workers=1) as writer, ray_session(spec, address, verbose=not quiet):
        result = run_sweep(cfg, the_plan, folder, resume=resume is not None, quiet=quiet)
        # written (~0.6 s: the plot) while Ray shuts down, which mostly waits for its processes to end
        written = writer.submit(write_results, cfg, result.results, result.best_config, folder)
    written.result()  # raises what writing raised
    return result
