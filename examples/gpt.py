"""A small byte-level GPT, the text it learns (the Python standard library's sources) and a training loop.

Shared by the examples and the benchmarks: random tensors compress unlike trained weights and AdamW moments, so
every measurement uses a model trained on real text.
"""

from __future__ import annotations

import math
import pathlib
import sysconfig
import time

import torch
import torch.nn.functional as F
from torch import nn


def stdlib_corpus(max_bytes: int = 64 << 20) -> torch.Tensor:
    """The bytes of the standard library's .py files (up to ``max_bytes``), as a uint8 tensor."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    parts, total = [], 0
    for path in sorted(root.rglob("*.py")):
        data = path.read_bytes()
        parts.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    return torch.frombuffer(bytearray(b"".join(parts)), dtype=torch.uint8)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A byte-level GPT: vocabulary 256, learned positions, pre-norm blocks, tied output head."""

    def __init__(self, dim: int = 768, layers: int = 12, heads: int = 12, context: int = 256) -> None:
        super().__init__()
        self.context = context
        self.embed = nn.Embedding(256, dim)
        self.pos = nn.Parameter(torch.zeros(context, dim))
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        nn.init.normal_(self.embed.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx) + self.pos[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.ln(x) @ self.embed.weight.t()


def train(
    model: GPT, corpus: torch.Tensor, steps: int, batch: int, device: str, lr: float = 6e-4, log_every: int = 50
) -> torch.optim.AdamW:
    """Train ``model`` for ``steps`` AdamW steps (bf16 autocast on CUDA); returns the optimizer."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
    gen = torch.Generator().manual_seed(0)
    begin = time.perf_counter()
    for step in range(steps):
        starts = torch.randint(0, corpus.numel() - model.context - 1, (batch,), generator=gen)
        rows = torch.stack([corpus[s : s + model.context + 1] for s in starts.tolist()]).long().to(device)
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * step / steps))
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = F.cross_entropy(model(rows[:, :-1]).flatten(0, 1).float(), rows[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % log_every == 0 or step == steps - 1:
            print(f"step {step:4d}  loss {loss.item():.3f}  {time.perf_counter() - begin:.1f}s", flush=True)
    return opt


def state_by_class(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, list[torch.Tensor]]:
    """The checkpoint's tensors by class (BENCHMARKS.md, Codec): bf16 weights, fp32 weights, Adam m, v."""
    params = [p.detach() for p in model.parameters()]
    states = [opt.state[p] for p in model.parameters() if p in opt.state]
    return {
        "bf16 w": [p.bfloat16() for p in params],
        "fp32 w": params,
        "adam m": [s["exp_avg"] for s in states],
        "adam v": [s["exp_avg_sq"] for s in states],
    }
