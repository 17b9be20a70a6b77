"""The shared loop under torchrun, no Ray: the baseline bench/startup.py compares `orchestrator launch` with.

    torchrun --nproc-per-node 2 bench/torchrun_entry.py '{"model": "digits-cnn", "max_steps": 1}' OUT_DIR
"""

from __future__ import annotations

import json
import logging
import os
import sys

import torch.distributed as dist

from orchestrator.raytrain.logs import setup_rank_logging
from trainables.config import TrainConfig
from trainables.context import DistContext
from trainables.local import LocalReporter
from trainables.run import run_training


def main() -> int:
    cfg = TrainConfig.model_validate(json.loads(sys.argv[1]))
    out = sys.argv[2]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    setup_rank_logging(rank, os.path.join(out, "logs"))
    logging.getLogger("orchestrator.bench").info("rank %d of %d, pid %d", rank, world, os.getpid())
    dist.init_process_group("gloo")
    run_training(cfg, DistContext(rank=rank, world_size=world, local_rank=rank), LocalReporter(out if rank == 0
                                                                                                 else None))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Not through Python's finalization, where a torch thread still alive after destroy_process_group can
    # abort the rank after its work is done (tests/helpers.end_rank says how): a bench baseline must not fail.
    os._exit(code)
