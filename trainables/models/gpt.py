"""A GPT in the manner of nanoGPT: pre-norm blocks, causal attention through SDPA (flash kernels on GPU),
tied embeddings. `pipeline_layers()` lists it as a sequence that model parallel cuts into stages."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 256
    block_size: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        # (B, T, C) -> (B, heads, T, C/heads)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.n_embd, 4 * cfg.n_embd), nn.GELU(), nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Embedding(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.pos = nn.Embedding(cfg.block_size, cfg.n_embd)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, C)
        return self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))


class TiedHead(nn.Module):
    """Final norm and the output projection, which reuses the token embedding's weight (weight tying).

    The weight is read from the embedding at call time and copied to this stage's device if a pipeline put
    the two on different GPUs; autograd carries the gradient back. Owning no copy keeps one Parameter."""

    def __init__(self, cfg: GPTConfig, embed: Embedding) -> None:
        super().__init__()
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self._embed = [embed]  # a list, so the embedding is not registered (and saved) twice

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C) -> (B, T, vocab)
        weight = self._embed[0].tok.weight
        return F.linear(self.ln_f(x), weight.to(x.device, non_blocking=True))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = Embedding(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.head = TiedHead(cfg, self.embed)
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2's scaled init of residual projections
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, 0.0, 0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def fsdp_blocks(self) -> list[nn.Module]:
        """What FSDP shards one by one: the transformer blocks. The embedding stays with the root, which keeps
        it gathered through the forward: the tied head reads its weight after the embedding ran."""
        return list(self.blocks)

    def pipeline_layers(self) -> list[nn.Module]:
        """The model as a sequence of layers, each feeding the next: what model parallel cuts into stages."""
        return [self.embed, *self.blocks, self.head]

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, vocab)
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)
