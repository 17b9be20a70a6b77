"""The Llama family's shapes by name, apart from the model (no torch): the registry lists them without
importing it. (dim, layers, heads, kv_heads, ffn_dim): Llama 3.2 1B's and 3B's, Llama 3 8B's, and a toy."""

from __future__ import annotations

LLAMA_SIZES: dict[str, tuple[int, int, int, int, int]] = {
    "llama-toy": (128, 4, 4, 2, 352),
    "llama-1b": (2048, 16, 32, 8, 8192),
    "llama-3b": (3072, 28, 24, 8, 8192),
    "llama-8b": (4096, 32, 32, 8, 14336),
}
