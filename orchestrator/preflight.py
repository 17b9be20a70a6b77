"""Everything a launch, a sweep or a pool can be refused for without a cluster: the spec loads, the plan fits
it, the model and dataset go together, the entry function imports. Run on the driver before Ray starts and
before anything is written; each refusal is one ConfigError line."""

from __future__ import annotations

from cluster.plan import Plan, plan
from cluster.spec import ClusterSpec, load_spec
from groundwork.errors import ConfigError
from orchestrator.config import LaunchConfig
from orchestrator.raytrain.job import resolve_entry, takes_config
from trainables.run import check_config


def check_entry(entry: str) -> None:
    """The function imports, and takes one argument (the config dict) or none, as TorchTrainer allows."""
    try:
        fn = resolve_entry(entry)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"entry {entry!r} cannot be loaded ({exc}): check the module is importable") from None
    if takes_config(fn) is None:
        raise ConfigError(f"entry {entry!r} cannot be called as train_func(config) or train_func(): a train"
                          " function takes one argument (its config dict) or none")


def checked_plan(cfg: LaunchConfig) -> tuple[ClusterSpec, Plan, str | None]:
    """Spec, plan and Ray address for a launch, after every check that needs no cluster."""
    spec = load_spec(cfg.cluster)
    the_plan = plan(spec, cfg.job_request())
    check_config(cfg.train)
    if cfg.entry:
        check_entry(cfg.entry)
    address = cfg.address or spec.address
    if address is None and spec.num_nodes > 1:
        raise ConfigError(f"the cluster spec describes {spec.num_nodes} nodes but no Ray address is given:"
                          " pass --address or set address: in the spec")
    return spec, the_plan, address
