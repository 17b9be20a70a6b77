"""The bench scripts in their CI-sized --quick mode: they run and write well-formed results. No timings are
asserted (benchmarks measure; tests check behaviour)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO


@pytest.mark.parametrize("script, keys", [
    ("step_overhead.py", {"bare_samples_per_s", "ray_samples_per_s", "bare_over_ray", "command"}),
    ("model_parallel.py", {"tokens_per_s_k1", "tokens_per_s_k2", "k_over_k1", "command"}),
    # the two that start many Ray sessions (minutes each): `slow`, so the default suite stays CI-sized
    pytest.param("sweep_overhead.py", {"step_fraction", "trials_per_minute", "wall_s", "trials", "command"},
                 marks=pytest.mark.slow),
    ("input_pipeline.py", {"loader_images_per_s", "model_images_per_s_parquet", "loader_over_model", "command"}),
    pytest.param("startup.py", {"first_step_ratio", "pool_first_step_ratio", "up_first_step_ratio",
                                "script_first_step_ratio", "median_s", "runs", "command"}, marks=pytest.mark.slow),
])
def test_bench_quick_mode_writes_results(tmp_path, script, keys):
    out = tmp_path / "result.json"
    extra = ["--batch-size", "8"] if script == "model_parallel.py" else []
    proc = subprocess.run([sys.executable, str(REPO / "bench" / script), "--quick", "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert keys <= set(result)
    numbers = [v for k, v in result.items() if isinstance(v, float)]
    assert numbers and all(v > 0 for v in numbers)
