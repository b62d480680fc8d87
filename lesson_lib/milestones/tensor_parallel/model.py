"""Chapter 8's small transformer, unsharded: the single-process reference and the source of the
weights the parallel layouts shard.

Tensors are ``[seq, batch, hidden]`` (as in Megatron-LM); attention counts heads from the width it
is handed (as torchtitan), so the same module runs whole, sharded, or under ``ColwiseParallel``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(kw_only=True)
class Config:
    """A transformer, its data and its training, small enough for 4 ranks on 2 cores."""

    vocab: int = 32
    """Tokens in the vocabulary."""
    d_model: int = 32
    """Width of the residual stream."""
    heads: int = 4
    """Attention heads; tensor parallelism gives each rank heads / t of them."""
    layers: int = 2
    """Transformer blocks."""
    ffn: int = 128
    """Width of the MLP's hidden layer; each rank holds ffn / t of it."""
    seq: int = 16
    """Tokens per sequence; sequence parallelism gives each rank seq / t of them."""
    batch: int = 8
    """Sequences per step (the global batch: data parallelism splits it)."""
    steps: int = 3
    """SGD steps."""
    lr: float = 0.1
    """SGD learning rate."""
    seed: int = 0
    """Weights and data."""

    @classmethod
    def tiny(cls, **kw) -> "Config":
        """The chapter's equality runs: a few seconds on 4 ranks."""
        return cls(**kw)

    @classmethod
    def memory(cls, **kw) -> "Config":
        """Wide enough that weights and activations, not the interpreter, fill the allocator's count."""
        return cls(**{"d_model": 128, "heads": 8, "ffn": 512, "seq": 64, "batch": 8, "vocab": 64,
                      "steps": 1, **kw})

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads


class Attention(nn.Module):
    """Causal multi-head self-attention written out (softmax(QKᵀ/√d)V), heads counted from q's width."""

    def __init__(self, d: int, head_dim: int):
        super().__init__()
        self.head_dim = head_dim
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        return self.o(attend(self.q(x), self.k(x), self.v(x), self.head_dim))


def attend(q, k, v, head_dim: int):
    """``[s, b, heads·d]`` each → ``[s, b, heads·d]``: causal attention, head by head."""
    s, b, _ = q.shape
    q, k, v = (t.view(s, b, -1, head_dim).permute(1, 2, 0, 3) for t in (q, k, v))  # [b, h, s, d]
    scores = q @ k.transpose(-1, -2) / math.sqrt(head_dim)
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
    out = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
    return out.permute(2, 0, 1, 3).reshape(s, b, -1)


class MLP(nn.Module):
    def __init__(self, d: int, ffn: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, ffn), nn.Linear(ffn, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        self.attn, self.mlp = Attention(cfg.d_model, cfg.head_dim), MLP(cfg.d_model, cfg.ffn)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    """Embeddings, ``cfg.layers`` blocks, a final norm and the head; the same weights for every
    ``cfg.seed`` on every rank."""

    def __init__(self, cfg: Config):
        super().__init__()
        torch.manual_seed(cfg.seed)
        self.tok, self.pos = nn.Embedding(cfg.vocab, cfg.d_model), nn.Embedding(cfg.seq, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln, self.head = nn.LayerNorm(cfg.d_model), nn.Linear(cfg.d_model, cfg.vocab)

    def embed(self, tokens):
        """``[s, b]`` token ids → ``[s, b, d]``."""
        return self.tok(tokens) + self.pos(torch.arange(tokens.shape[0], device=tokens.device))[:, None]

    def body(self, x):
        for block in self.blocks:
            x = block(x)
        return x

    def finish(self, x):
        return self.head(self.ln(x))

    def forward(self, tokens):
        return self.finish(self.body(self.embed(tokens)))


def batch(cfg: Config, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s tokens ``[seq, batch]`` and targets: each token's predecessor (a copy task
    that attention can learn), the same on every rank."""
    g = torch.Generator().manual_seed(cfg.seed * 1000 + step)
    tokens = torch.randint(0, cfg.vocab, (cfg.seq, cfg.batch), generator=g)
    return tokens, torch.cat([tokens[:1], tokens[:-1]])


def loss_fn(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def sgd(params, lr: float) -> None:
    with torch.no_grad():
        for p in params:
            p -= lr * p.grad
            p.grad = None
