"""Peak FLOP/s by GPU type, for MFU (no torch: the driver reads it from the cluster spec's gpus.type)."""

from __future__ import annotations

# dense TFLOP/s per GPU from NVIDIA's datasheets: (bf16/fp16 tensor cores, TF32 tensor cores)
PEAK_TFLOPS: dict[str, tuple[float, float]] = {
    "H200": (989.0, 494.5), "H100": (989.0, 494.5), "A100": (312.0, 156.0), "L40S": (362.1, 183.0),
    "L4": (121.0, 60.0), "A10": (125.0, 62.5), "V100": (125.0, 15.7),
}


def peak_tflops_of(gpu: str, precision: str) -> float | None:
    """The table's TFLOP/s for a GPU name or type (`NVIDIA H200`, `H100-SXM`, `a100-80gb`) at a precision."""
    found = next((peaks for key, peaks in PEAK_TFLOPS.items() if key in gpu.upper()), None)
    if found is None:
        return None
    return found[0] if precision in ("bf16", "fp16", "fp8") else found[1]  # fp8: MFU of the bf16 peak
