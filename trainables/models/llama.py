"""A Llama-style decoder (Llama 3's layout): RMSNorm before attention and MLP, rotary position embeddings,
grouped-query attention (fewer key/value heads than query heads), a SwiGLU MLP, no biases, an untied output
projection. Sizes from a CPU-test toy to Llama 3's 1B and 8B shapes, for measuring memory and speed on real
shapes (weights are random: the built-in datasets are synthetic or small)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from trainables.models.shapes import LLAMA_SIZES


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    max_seq_len: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5


def rope_tables(cfg: LlamaConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of each position's rotation angle, per pair of a head's dimensions: (T, head_dim/2)."""
    head_dim = cfg.dim // cfg.n_heads
    freqs = 1.0 / cfg.rope_theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
    angles = torch.outer(torch.arange(cfg.max_seq_len).float(), freqs)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of (B, heads, T, head_dim): each (even, odd) pair turned by its position's angle."""
    even, odd = x.float()[..., 0::2], x.float()[..., 1::2]
    out = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return out.flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.dim // cfg.n_heads
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * self.head_dim, bias=False)
        self.wkv = nn.Linear(cfg.dim, 2 * cfg.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * self.head_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k, v = (z.view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2) for z in self.wkv(x).chunk(2, dim=-1))
        q, k = rotate(q, cos[:t], sin[:t]), rotate(k, cos[:t], sin[:t])
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_kv_heads != self.n_heads)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class SwiGLU(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.w13 = nn.Linear(cfg.dim, 2 * cfg.ffn_dim, bias=False)  # gate and up projections in one matmul
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


class LlamaBlock(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.blocks = nn.ModuleList(LlamaBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        cos, sin = rope_tables(cfg)
        self.register_buffer("cos", cos, persistent=False)  # rebuilt, not saved: checkpoints hold weights only
        self.register_buffer("sin", sin, persistent=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:  # residual projections scaled by depth, as GPT-2 and torchtitan do
                std = 0.02 / math.sqrt(2 * cfg.n_layers) if name.endswith(("wo.weight", "w2.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def fsdp_blocks(self) -> list[nn.Module]:
        """Each decoder block, and the output projection (the vocabulary's matrix, the largest one)."""
        return [*self.blocks, self.output]

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, vocab)
        x = self.tok(idx)
        for block in self.blocks:
            x = block(x, self.cos, self.sin)
        return self.output(self.norm(x))


def llama(size: str, vocab_size: int, max_seq_len: int) -> Llama:
    dim, layers, heads, kv_heads, ffn = LLAMA_SIZES[size]
    return Llama(LlamaConfig(vocab_size=vocab_size, max_seq_len=max_seq_len, dim=dim, n_layers=layers,
                             n_heads=heads, n_kv_heads=kv_heads, ffn_dim=ffn))
