"""Where the built-in datasets come from and how many samples each holds, without torch: the driver checks a
run's data (trainables.data.check) before any worker starts and should not pay torch's import (~1.2 s) for it."""

from __future__ import annotations

import gzip
import importlib.util
import sysconfig
from pathlib import Path

from groundwork.errors import ConfigError
from trainables.config import TrainConfig

CORPUS_BYTES = 4 * 2**20  # 4 MiB: enough for a char model to learn, small enough to read in well under 1 s


def digits_csv() -> Path:
    """The data file scikit-learn's load_digits reads, found without importing scikit-learn (a 1-2 s import
    that every digits run and every sweep trial would pay before its first step)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("the digits dataset ships with scikit-learn: pip install scikit-learn")
    return Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"


def digits_count() -> int:
    with gzip.open(digits_csv(), "rt") as rows:
        return sum(1 for row in rows if row.strip())


def stdlib_corpus(max_bytes: int = CORPUS_BYTES) -> bytes:
    """The first max_bytes of the stdlib's .py files in sorted order: the same bytes on every run."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(root.glob("*.py")) + sorted(root.glob("*/*.py")):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    return b"".join(chunks)[:max_bytes]


def held_out(n: int, val_fraction: float) -> int:
    """How many of n samples a shuffled split (trainables.data.split) holds out for validation."""
    return max(1, round(n * val_fraction))


def token_cut(n_tokens: int, val_fraction: float) -> int:
    """Where a contiguous token split starts validation: val text never seen in training."""
    return int(n_tokens * (1 - val_fraction))


def fake_token_split(cfg: TrainConfig) -> tuple[int, int]:
    """(tokens in all, where validation starts) of fake-tokens: its sizes, known without making it."""
    n_tokens = cfg.fake_samples * cfg.seq_len + 1
    return n_tokens, token_cut(n_tokens, cfg.val_fraction)


def windows(n_tokens: int, seq_len: int) -> int:
    """Samples of seq_len+1-token windows in n_tokens (trainables.data.text.TokenWindows)."""
    return (n_tokens - 1) // seq_len


def builtin_sizes(cfg: TrainConfig, name: str) -> tuple[int, int]:
    """(train, val) samples of a built-in dataset other than parquet."""
    if name == "digits":
        n = digits_count()
        return n - held_out(n, cfg.val_fraction), held_out(n, cfg.val_fraction)
    if name == "fake-images":
        return cfg.fake_samples, held_out(cfg.fake_samples, cfg.val_fraction)
    if name == "fake-tokens":
        n_tokens, cut = fake_token_split(cfg)
    elif name == "stdlib-text":
        n_tokens = len(stdlib_corpus())
        cut = token_cut(n_tokens, cfg.val_fraction)
    else:
        raise ValueError(f"no size rule for dataset {name!r}: add one beside the others")
    return windows(cut, cfg.seq_len), windows(n_tokens - cut, cfg.seq_len)
