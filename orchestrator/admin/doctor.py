"""`orchestrator doctor`: what this machine and its Ray cluster offer, in one table."""

from __future__ import annotations

import shutil
import subprocess

from rich.console import Console
from rich.table import Table

from cluster.spec import load_spec


def torch_facts() -> list[tuple[str, str]]:
    import torch  # deferred: print_pairs (cluster validate, plan) must not pay for torch

    facts = [("torch", torch.__version__), ("CUDA available", str(torch.cuda.is_available())),
             ("CUDA (torch built with)", str(torch.version.cuda))]
    if torch.backends.cudnn.is_available():
        facts.append(("cuDNN", str(torch.backends.cudnn.version())))
    if torch.cuda.is_available():
        facts.append(("NCCL", ".".join(map(str, torch.cuda.nccl.version()))))
        facts.append(("GPUs", str(torch.cuda.device_count())))
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            facts.append((f"cuda:{i}", f"{props.name}, {props.total_memory / 2**30:.1f} GiB,"
                                       f" sm_{props.major}{props.minor}"))
    else:
        facts.append(("GPUs", "0"))
    facts.append(("gloo", str(torch.distributed.is_gloo_available())))
    return facts


def nvidia_smi() -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        return subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
    except (subprocess.SubprocessError, OSError):
        return None


def ray_facts(address: str | None) -> list[tuple[str, str]]:
    import ray  # deferred: `doctor --no-ray` and print_pairs must not pay for Ray

    from orchestrator.raytrain.session import ray_session  # deferred: imports Ray

    facts = [("ray", ray.__version__)]
    with ray_session(load_spec(), address):
        facts.append(("ray nodes", str(len([n for n in ray.nodes() if n["Alive"]]))))
        for key, value in sorted(ray.cluster_resources().items()):
            if not key.startswith("node:"):
                facts.append((f"ray {key}", f"{value:g}"))
    return facts


def print_pairs(title: str, pairs: list[tuple[str, str]]) -> None:
    """A two-column table of facts: doctor's, and the CLI's plan and cluster summaries."""
    table = Table("what", "value", title=title)
    for key, value in pairs:
        table.add_row(key, value)
    Console().print(table)


def doctor(address: str | None = None, with_ray: bool = True) -> int:
    print_pairs("orchestrator doctor", torch_facts() + (ray_facts(address) if with_ray else []))
    smi = nvidia_smi()
    if smi:
        Console().print(smi)
    return 0
