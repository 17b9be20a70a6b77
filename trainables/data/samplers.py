"""Per-rank sharding. Training uses DistributedSampler (also for one process, so 1 and N workers see the same
global order); it can start mid-epoch on resume. Evaluation shards without padding so metrics are exact."""

from __future__ import annotations

from collections.abc import Iterator

from torch.utils.data import DistributedSampler, Sampler


class ResumableSampler(DistributedSampler):
    """DistributedSampler that can skip the samples this rank already consumed in the current epoch."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.start = 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        super().set_epoch(epoch)
        self.start = start

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        return iter(indices[self.start :])

    def __len__(self) -> int:
        return self.num_samples - self.start


class ShardSampler(Sampler[int]):
    """Rank r of w takes r, r+w, r+2w, ...: each sample exactly once across ranks, no padding."""

    def __init__(self, n: int, rank: int, world_size: int) -> None:
        self.indices = list(range(rank, n, world_size))

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)
