from __future__ import annotations

from trainables.data.shipped import held_out


def split_indices(n: int, val_fraction: float, seed: int = 0) -> tuple[list[int], list[int]]:
    """A fixed shuffled train/val split. Seeded apart from the run seed so every run holds out the same rows."""
    import torch  # here: the driver's data check counts the split (shipped.held_out) without torch

    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    n_val = held_out(n, val_fraction)
    return sorted(order[n_val:]), sorted(order[:n_val])
