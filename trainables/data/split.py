from __future__ import annotations

import torch


def split_indices(n: int, val_fraction: float, seed: int = 0) -> tuple[list[int], list[int]]:
    """A fixed shuffled train/val split. Seeded apart from the run seed so every run holds out the same rows."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    n_val = max(1, round(n * val_fraction))
    return sorted(order[n_val:]), sorted(order[:n_val])
