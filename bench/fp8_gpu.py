"""float8 vs bf16 through `orchestrator launch` on one GPU: the same Llama-style model (llama-1b: Llama 3.2
1B's shape with an untied output, 1.5B parameters), torch.compile, batch 8 x 1024, side by side in one call;
tokens/s, MFU (of the bf16 peak), peak memory and energy per token from each run's summary.json.

    python3 bench/fp8_gpu.py --out bench/results/fp8_gpu_h200.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from common import ONE_GPU, launch_summary, provenance, write_result

RUN = ["--model", "llama-1b", "--dataset", "fake-tokens", "--seq-len", "1024", "--batch-size", "8", "--compile",
       "--optimizer", "sgd", "--lr", "1e-3", "--fake-samples", "1024", "--max-steps", "70", "--log-every", "10",
       *ONE_GPU]


def launch(precision: str, folder: Path, extra: list[str]) -> dict:
    summary, tail = launch_summary([*RUN, *extra, "--precision", precision], f"llama-{precision}", folder)
    if summary is None:
        raise SystemExit(f"llama-{precision} failed: {tail}")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--recipe", default="tensorwise")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        bf16 = launch("bf16", Path(tmp), [])
        fp8 = launch("fp8", Path(tmp), ["--fp8-recipe", args.recipe])
    result = {"what": f"llama-1b (1.5B, untied output) bf16 vs fp8 ({args.recipe}) through `orchestrator launch`,"
                      " torch.compile, batch 8 x 1024, SGD, 70 steps, one GPU; the runs' summaries (first window"
                      " left out)", "bf16": bf16, "fp8": fp8,
              "fp8_over_bf16_tokens_per_s": round(fp8["tokens_per_s"] / bf16["tokens_per_s"], 3), **provenance()}
    print(json.dumps(result, indent=1))
    write_result(result, args.out)


if __name__ == "__main__":
    main()
