"""A torchrun script in the style of PyTorch's own DDP tutorial (multigpu_torchrun.py): it initialises its
process group from the environment torchrun sets, reads LOCAL_RANK, shards its data with DistributedSampler,
and saves and loads its own snapshot on rank 0. Run it with `torchrun --nproc_per_node 2 ddp_tutorial.py` or
with `orchestrator launch --script ddp_tutorial.py --workers 2 -- ARGS`; nothing in it knows which."""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--snapshot", default="snapshot.pt")
    parser.add_argument("--out", default="final.pt")
    parser.add_argument("--pause", type=float, default=0.0, help="seconds after each epoch")
    parser.add_argument("--crash-at-epoch", type=int, default=-1, help="rank 1 raises at this epoch")
    parser.add_argument("--report", action="store_true", help="orchestrator.report each epoch's loss")
    parser.add_argument("--nan-at-epoch", type=int, default=-1, help="report a nan loss at this epoch")
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    print(f"[rank {rank}] {dist.get_backend()} on {device}, CUDA_VISIBLE_DEVICES="
          f"{os.environ.get('CUDA_VISIBLE_DEVICES', '')}", flush=True)

    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(512, 20, generator=generator), torch.randint(0, 3, (512,), generator=generator))
    torch.manual_seed(0)
    inner = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 3)).to(device)
    model = DDP(inner, device_ids=[local_rank] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    epochs_run = 0
    if os.path.exists(args.snapshot):
        snapshot = torch.load(args.snapshot, map_location=device, weights_only=True)
        inner.load_state_dict(snapshot["model"])
        optimizer.load_state_dict(snapshot["optimizer"])
        epochs_run = snapshot["epochs_run"]
        print(f"[rank {rank}] resuming from the snapshot at epoch {epochs_run}", flush=True)

    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    for epoch in range(epochs_run, args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = F.cross_entropy(model(x.to(device)), y.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"[rank {rank}] epoch {epoch} loss {loss.item():.4f}", flush=True)
        if args.report:  # optional: rows of the run under `orchestrator launch --script`, nothing under torchrun
            import orchestrator

            nan = float("nan") if epoch == args.nan_at_epoch else 1.0
            orchestrator.report({"step": epoch + 1, "loss": loss.item() * nan})
        if rank == 1 and epoch == args.crash_at_epoch:
            raise RuntimeError(f"rank 1 crashed at epoch {epoch}")
        if rank == 0:
            state = {"model": inner.state_dict(), "optimizer": optimizer.state_dict(), "epochs_run": epoch + 1}
            torch.save(state, args.snapshot + ".tmp")
            os.replace(args.snapshot + ".tmp", args.snapshot)
        dist.barrier()  # the snapshot is complete before any rank goes on
        time.sleep(args.pause)
    if rank == 0:
        torch.save(inner.state_dict(), args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
