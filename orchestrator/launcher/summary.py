"""A run's summary from its rows (summary.json, and the lines under the CLI's "done"): throughput, MFU, the
fullest GPU's peak memory, mean utilisation, power and energy per sample/token, all-reduce share; CPU use and
memory on CPU runs. The first window is left out of the means: it holds compilation and warm-up."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

SUMMARY_FILE = "summary.json"


def train_rows(rows: list[dict[str, float]]) -> list[dict[str, float]]:
    """The loop's rows between log points (validation rows repeat the last one's figures)."""
    return [r for r in rows if r.get("val_loss") is None and "samples_per_s" in r]


def _mean(rows: list[dict[str, float]], key: str) -> float | None:
    values = [r[key] for r in rows if isinstance(r.get(key), int | float)]
    return statistics.fmean(values) if values else None


def _peak(rows: list[dict[str, float]], key: str) -> tuple[float, int] | None:
    """The largest `<key>_max` over the rows and the rank that had it."""
    found = [(r[f"{key}_max"], int(r.get(f"{key}_max_rank", 0))) for r in rows
             if isinstance(r.get(f"{key}_max"), int | float)]
    return max(found) if found else None


def _energy(rows: list[dict[str, float]], steady: list[dict[str, float]]) -> dict[str, float]:
    """All GPUs' joules over every window (the run's cost), and per sample (and token) over the steady ones
    (the first holds compilation, whose joules buy no samples)."""
    windows = [r for r in steady if r.get("energy_j_per_sample") and r.get("gpu_energy_j_total")]
    if not windows:
        return {}
    joules = sum(r["gpu_energy_j_total"] for r in windows)
    samples = sum(r["gpu_energy_j_total"] / r["energy_j_per_sample"] for r in windows)
    out = {"gpu_energy_j": sum(r.get("gpu_energy_j_total") or 0.0 for r in rows),
           "energy_j_per_sample": joules / samples}
    tokens = [r["energy_j_per_sample"] / r["energy_j_per_token"] for r in windows if r.get("energy_j_per_token")]
    if tokens:
        out["energy_j_per_token"] = out["energy_j_per_sample"] / statistics.fmean(tokens)
    return out


def summarize(rows: list[dict[str, float]]) -> dict[str, float]:
    """The run's figures; empty for a run with no loop rows (a function's or script's own reports)."""
    train = train_rows(rows)
    steady = train[1:] or train
    if not train:
        return {}
    out: dict[str, float] = {}
    for key in ("samples_per_s", "tokens_per_s", "mfu", "gpu_util_pct_mean", "gpu_power_w_mean",
                "cpu_pct_mean", "allreduce_share_mean", "allreduce_ms_per_step_mean"):
        if (value := _mean(steady, key)) is not None:
            out[key.removesuffix("_mean")] = value
    for key in ("gpu_mem_mib", "gpu_max_alloc_mib", "rss_mib"):
        if peak := _peak(train, key):
            out[f"peak_{key}"], out[f"peak_{key}_rank"] = peak
    return {**out, **_energy(train, steady)}


def write_summary(rows: list[dict[str, float]], run_dir: Path) -> dict[str, float]:
    summary = summarize(rows)
    if summary:
        (run_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def summary_lines(summary: dict[str, float]) -> list[str]:
    """What the CLI prints under a finished run: the figures it has, in words."""
    s, lines = summary, []
    speed = [f"{s['samples_per_s']:,.0f} samples/s"] if "samples_per_s" in s else []
    speed += [f"{s['tokens_per_s']:,.0f} tokens/s"] if "tokens_per_s" in s else []
    speed += [f"MFU {s['mfu']:.1%}"] if "mfu" in s else []
    if speed:
        lines.append("speed: " + ", ".join(speed))
    if "peak_gpu_mem_mib" in s:
        gpu = [f"peak {s['peak_gpu_mem_mib']:,.0f} MiB used on the fullest GPU (rank {s['peak_gpu_mem_mib_rank']:.0f})"]
        gpu += [f"{s['peak_gpu_max_alloc_mib']:,.0f} MiB allocated by PyTorch"] if "peak_gpu_max_alloc_mib" in s else []
        gpu += [f"mean utilisation {s['gpu_util_pct']:.0f}%"] if "gpu_util_pct" in s else []
        gpu += [f"mean power {s['gpu_power_w']:.0f} W per GPU"] if "gpu_power_w" in s else []
        lines.append("GPU: " + ", ".join(gpu))
    if "energy_j_per_sample" in s:
        per = f"{s['energy_j_per_sample']:.4g} J/sample"
        per += f", {1e3 * s['energy_j_per_token']:.4g} mJ/token" if "energy_j_per_token" in s else ""
        lines.append(f"energy: {s['gpu_energy_j'] / 1e3:.4g} kJ in all GPUs, {per}")
    if "cpu_pct" in s and "peak_gpu_mem_mib" not in s:
        lines.append(f"CPU: mean {s['cpu_pct']:.0f}% per rank (100 = one core), peak RSS "
                     f"{s['peak_rss_mib']:,.0f} MiB (rank {s['peak_rss_mib_rank']:.0f})")
    if "allreduce_share" in s:
        lines.append(f"all-reduce: {s['allreduce_share']:.0%} of step time, {s['allreduce_ms_per_step']:.3g} ms/step")
    return lines
