"""`orchestrator top` and a run's summary on a GPU node: a one-node `cluster up` with the GPU in its spec, a
GPT-2 launch on it, `top --once` while the run trains (which run/rank holds the GPU), then the run's
summary lines, summary.json and gpu.png.

    python3 bench/top_gpu.py --out bench/results/top_gpu_h200.json --plots $OUT
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import provenance, write_result

SPEC = """name: one-gpu
address: 127.0.0.1:6391
storage: {path: runs, shared: true}
node_groups:
  - name: head
    role: head
    cpus: 8
    gpus: {count: 1, type: H200}
    network: {interfaces: [lo]}
"""
RUN = ["--model", "gpt2-124m", "--dataset", "fake-tokens", "--seq-len", "1024", "--batch-size", "32", "--compile",
       "--precision", "bf16", "--fake-samples", "8192", "--max-steps", "240", "--log-every", "20",
       "--workers", "1", "--gpus-per-worker", "1", "--name", "gpt2"]


def cli(*args: str, cwd: Path, **kw: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=cwd, capture_output=True, text=True,
                          **kw)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--plots", type=Path, help="copy gpu.png and loss.png here")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp())
    (folder / "spec.yaml").write_text(SPEC)
    up = cli("cluster", "up", "spec.yaml", cwd=folder)
    if up.returncode:
        raise SystemExit(f"cluster up failed: {up.stderr[-2000:]}")
    try:
        launch = subprocess.Popen([sys.executable, "-m", "orchestrator", "launch", "--cluster", "spec.yaml", *RUN],
                                  cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        log = folder / "runs" / "gpt2" / "logs" / "rank-0.log"
        deadline = time.monotonic() + 300
        while (time.monotonic() < deadline and launch.poll() is None
               and "first optimizer step" not in (log.read_text() if log.exists() else "")):
            time.sleep(1)
        time.sleep(5)
        top = cli("top", "--address", "127.0.0.1:6391", "--once", cwd=folder)
        out, err = launch.communicate(timeout=600)
    finally:
        cli("cluster", "down", cwd=folder)
    run_dir = folder / "runs" / "gpt2"
    if launch.returncode:
        raise SystemExit(f"launch failed: {err[-3000:]}")
    if args.plots:
        for name in ("gpu.png", "loss.png"):
            shutil.copy2(run_dir / name, args.plots / name)
    result = {"what": "GPT-2 124M bf16 compiled, batch 32 x 1024, on a one-node `cluster up` (spec gpus.type H200):"
                      " `orchestrator top --once` during the run, and the run's summary",
              "top": top.stdout.splitlines(), "top_rc": top.returncode,
              "done_lines": [line for line in err.splitlines() if line.strip()][-8:],
              "summary": json.loads((run_dir / "summary.json").read_text()), **provenance()}
    print(json.dumps(result, indent=1))
    write_result(result, args.out)


if __name__ == "__main__":
    main()
