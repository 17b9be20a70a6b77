"""Test helpers importable by Ray workers (functions in test modules' __main__ would not pickle)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from trainables.checkpoint import load_state


def final_weights(folder: str | Path) -> dict[str, torch.Tensor]:
    return load_state(folder)["model"]


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def fit_one_batch(model: torch.nn.Module, lr: float, steps: int = 5, seed: int = 0) -> list[float]:
    """SGD on one random batch of 8 32x32 images, 10 classes: the loss after each step."""
    generator = torch.Generator().manual_seed(seed)
    x, y = torch.rand(8, 3, 32, 32, generator=generator), torch.randint(0, 10, (8,), generator=generator)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def script_pids(script: str | Path) -> dict[int, int]:
    """RANK -> pid of every process on this machine running `script` (read from /proc: its command line and
    environment)."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and str(script).encode() in (entry / "cmdline").read_bytes():
                env = dict(v.split(b"=", 1) for v in (entry / "environ").read_bytes().split(b"\0") if b"=" in v)
                if b"RANK" in env:
                    found[int(env[b"RANK"])] = int(entry.name)
        except OSError:  # gone meanwhile, or not ours
            continue
    return found


def user_entry(config: dict) -> None:
    """A user's own train function for --entry: records what each worker was given."""
    import ray.train

    ctx = ray.train.get_context()
    out = Path(config["run_dir"]) / f"entry-rank{ctx.get_world_rank()}.json"
    out.write_text(json.dumps({"rank": ctx.get_world_rank(), "world": ctx.get_world_size(),
                               "lr": config["lr"], "omp": os.environ.get("OMP_NUM_THREADS")}))


def save_forever(folder: str, megabytes: int) -> None:
    """Save checkpoints checkpoint_000000, _000001, ... of `megabytes` each until killed (a save is slow
    enough for a SIGKILL to land inside one)."""
    from trainables.checkpoint import save_state

    state = {"model": {"w": torch.randn(megabytes * 2**18)}, "position": {"step": 0}}
    for n in range(10_000):
        state["position"]["step"] = n
        save_state(state, Path(folder) / f"checkpoint_{n:06d}")
        print(n, flush=True)


def straggler_rank(rank: int, world: int, port: int, out: str) -> None:
    """One rank of a 2-process gloo job of the shared loop in which rank 1 reads its data slowly (a slow
    disk, simulated by a sleep per sample); writes rank 0's logged rows to `out`."""
    import time

    import torch.distributed as dist

    import trainables.run
    from trainables.config import TrainConfig
    from trainables.context import DistContext
    from trainables.data import build_datasets
    from trainables.local import LocalReporter

    class Slow(torch.utils.data.Dataset):
        def __init__(self, inner):
            self.inner = inner

        def __len__(self):
            return len(self.inner)

        def __getitem__(self, i):
            time.sleep(0.002)
            return self.inner[i]

    def slow_on_rank_1(cfg, name, user):
        train, val, meta = build_datasets(cfg, name, user)
        return (Slow(train) if rank == 1 else train), val, meta

    trainables.run.build_datasets = slow_on_rank_1
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    reporter = LocalReporter()
    cfg = TrainConfig(model="digits-cnn", max_steps=12, log_every=4)
    trainables.run.run_training(cfg, DistContext(rank=rank, world_size=world), reporter)
    if rank == 0:
        Path(out).write_text(json.dumps(reporter.rows))
    end_rank()


def ray_docs_train_func(config: dict) -> None:
    """A train function written as Ray Train's docs teach: its own defaults through config.get, a model
    prepared by ray.train.torch, a report every epoch with a checkpoint every other one, get_checkpoint
    on a restart, and at the end the list of checkpoints reported (which Ray Train's controller answers).
    `pause_s` slows each epoch so a test can kill a rank mid-run."""
    import tempfile
    import time

    import ray.train
    import ray.train.torch
    import torch.nn.functional as F

    lr, epochs = config.get("lr", 1e-2), config.get("epochs", 4)
    torch.manual_seed(0)
    x = torch.randn(256, 8)
    y = x @ torch.arange(8.0) + 1.0
    inner = torch.nn.Linear(8, 1)
    model = ray.train.torch.prepare_model(inner)  # DDP across the ranks
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as folder:
            state = torch.load(Path(folder) / "model.pt", weights_only=True)
        inner.load_state_dict(state["model"])
        start = state["epoch"] + 1
        print(f"resumed at epoch {start}")
    for epoch in range(start, epochs):
        loss = F.mse_loss(model(x).squeeze(-1), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(config.get("pause_s", 0.0))
        metrics = {"loss": loss.item(), "epoch": epoch, "lr_used": lr}
        print(f"epoch {epoch} loss {loss.item():.4f}")
        if epoch % 2 == 1:
            with tempfile.TemporaryDirectory() as folder:
                torch.save({"model": inner.state_dict(), "epoch": epoch}, Path(folder) / "model.pt")
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(folder))
        else:
            ray.train.report(metrics)
    print(f"checkpoints reported: {len(ray.train.get_all_reported_checkpoints())}")


def nan_train_func() -> None:
    """No config argument (TorchTrainer accepts that); its second report's loss is nan."""
    import ray.train

    ray.train.report({"loss": 1.0})
    ray.train.report({"loss": float("nan")})


def hang_in_all_reduce_on_rank_1(config: dict) -> None:
    """Both ranks report once; then rank 1 enters an all-reduce that rank 0 never joins (a collective out of
    step: the classic distributed hang). Gloo's own timeout would take 30 minutes."""
    import ray.train
    import torch
    import torch.distributed as dist

    ray.train.report({"loss": 1.0})
    if ray.train.get_context().get_world_rank() == 1:
        dist.all_reduce(torch.ones(1))
    ray.train.report({"loss": 0.5})


def fails_before_training(config: dict) -> None:
    """A bug on the first line: every rank fails before its first report."""
    raise KeyError(config["no_such_setting"])


def read_shard(config: dict) -> None:
    """Reads the Ray Data dataset named "rows" and reports how many rows this rank saw."""
    import ray.train

    shard = ray.train.get_dataset_shard("rows")
    seen = sum(len(batch["x"]) for batch in shard.iter_batches(batch_size=16))
    ray.train.report({"rows_seen": seen})


def end_rank() -> None:
    """The end of a rank run by torch.multiprocessing: the process group destroyed, output flushed, and the
    process gone without Python's finalization. During finalization a C++ thread of torch's (gloo's or the
    autograd engine's, still alive after destroy_process_group) that takes the GIL is ended by Python 3.11
    mid-unwind, and the rank dies of SIGABRT ("terminate called without an active exception", main thread
    with no Python frame: seen in 1 of ~90 FSDP runs here and in CI) after all its work is done."""
    import sys

    import torch.distributed as dist

    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def strategy_rank(rank: int, world: int, port: int, out: str, settings: dict, resume: str | None) -> None:
    """One rank of a run of the shared loop in plain processes (gloo, no Ray), `out` its run folder: rank 0
    keeps the checkpoints there and its rows in out/rows.json. `resume`: a checkpoint folder every rank starts from."""
    import torch.distributed as dist

    from trainables.checkpoint import load_state
    from trainables.config import TrainConfig
    from trainables.context import DistContext
    from trainables.local import LocalReporter
    from trainables.run import run_training

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    reporter = LocalReporter(out if rank == 0 else None)
    saved = load_state(resume) if resume else None
    run_training(TrainConfig(**settings), DistContext(rank=rank, world_size=world), reporter, saved, run_dir=out)
    if rank == 0:
        Path(out, "rows.json").write_text(json.dumps(reporter.rows))
    end_rank()


def noting_where_built(meta, cfg):  # noqa: ANN001, ANN201 (a model factory, as a user writes one)
    """The built-in model $BUILT_MODEL; its first build on each rank notes in $BUILT_NOTES/rank-N the device of
    its first parameter and of each buffer, as the factory made them."""
    import torch.distributed as dist

    from trainables.models import build_model

    model = build_model(os.environ["BUILT_MODEL"], meta, cfg)
    note = Path(os.environ["BUILT_NOTES"], f"rank-{dist.get_rank()}")
    if not note.exists():
        note.write_text(" ".join(t.device.type for t in (next(model.parameters()), *model.buffers())))
    return model


def reads_its_weights(meta):  # noqa: ANN001, ANN201 (a model factory, as a user writes one)
    """The digits CNN, built by a factory that reads a weight's value (as a user's init might)."""
    from trainables.models import build_model

    model = build_model("digits-cnn", meta)
    assert float(next(model.parameters()).abs().max()) > 0
    return model
