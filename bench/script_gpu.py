"""An unmodified torchrun script on the GPU: the DDP-tutorial script of the tests under
`torchrun --nproc-per-node N` and under `orchestrator launch --script --workers N --gpus-per-worker 1`, side by
side in one run. Both use NCCL (the script picks it when CUDA is there); the final weights are compared and the
backend, device and CUDA_VISIBLE_DEVICES each rank saw are read back from the orchestrator's rank logs.

    python3 bench/script_gpu.py --workers 1 --out bench/results/script_gpu_h200.json
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import provenance, write_result

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "data" / "scripts" / "ddp_tutorial.py"
CLI = [sys.executable, "-m", "orchestrator"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(command: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command[:4])} failed: {proc.stdout[-1500:]}{proc.stderr[-1500:]}")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    script_args = ["--epochs", str(args.epochs)]
    with tempfile.TemporaryDirectory() as tmp:
        ref, ours = Path(tmp) / "torchrun", Path(tmp) / "orchestrator"
        ref.mkdir(), ours.mkdir()
        torchrun_s = timed([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.workers),
                            "--master-port", str(free_port()), str(SCRIPT), *script_args], ref)
        gpus = ["--gpus-per-worker", "1"] if torch.cuda.is_available() else []  # (a CPU try of the bench)
        launch_s = timed([*CLI, "launch", "--script", str(SCRIPT), "--workers", str(args.workers), *gpus,
                          "--name", "script-gpu", "--quiet", "--", *script_args], ours)
        a = torch.load(ref / "final.pt", weights_only=True)
        b = torch.load(ours / "final.pt", weights_only=True)
        diff = max((a[k].float() - b[k].float()).abs().max().item() for k in a)
        logs = {p.name: [line for line in p.read_text().splitlines() if " on " in line or "epoch" in line][:3]
                for p in sorted((ours / "runs" / "script-gpu" / "logs").glob("rank-*.log"))}
    result = {
        "what": f"the DDP-tutorial torchrun script, {args.epochs} epochs, {args.workers} GPU worker(s), NCCL: "
                "torchrun vs orchestrator launch --script",
        "torchrun_s": round(torchrun_s, 1), "orchestrator_script_s": round(launch_s, 1),
        "ratio": round(launch_s / torchrun_s, 2), "max_abs_weight_diff": diff, "rank_logs": logs,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
        **provenance(),
    }
    print(result)
    write_result(result, args.out)


if __name__ == "__main__":
    main()
