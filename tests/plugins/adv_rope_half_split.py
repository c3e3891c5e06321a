"""Adversarial plugin: RoPE in the half-split layout (GPT-NeoX / LLaMA-HF ``rotate_half``), declared
as the paper's RoPE.

Fault: feature i is rotated with feature i + d_k/2 (``torch.cat((-x2, x1))``) where RoFormer (eq. 34)
rotates the interleaved pairs (2i, 2i+1). Both are rotary embeddings and both are relative, but for
the same W_q and W_k they are different functions: they agree only after the rows of W_q and W_k
are permuted within each head -- the classic bug when converting Meta LLaMA weights to the
HuggingFace layout (or back) without the permutation. The component declares the paper's formula
(``differs=... reference="rotary"``) and no permutation (``qk_order``). Not declared buggy.

Expected: ``check`` fails with the positional component differing from RoFormer's rotation, named
"RoPE in the half-split layout (GPT-NeoX / LLaMA-HF rotate_half) where the paper's interleaved pairs
(2i, 2i+1) are meant". ``good_rope_half_split`` is the same code declaring the permutation: it passes.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_rope_half_split"
EXPECT_CHECK = "fail"
EXPECT_REASON = "RoPE rotates half-split pairs (i, i + d_k/2) while declaring the paper's interleaved formula"


class HalfSplitRoPE(nn.Module):
    """x * sqrt(D) on the embeddings; q and k rotated with ``rotate_half`` (GPT-NeoX layout)."""

    def __init__(self, ctx):
        super().__init__()
        self.scale = math.sqrt(ctx.cfg.d_model)
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def forward(self, x):
        return self.dropout(x * self.scale)

    @staticmethod
    def rotate(x):
        """x (..., L, d) -> x * cos + rotate_half(x) * sin, frequencies repeated over both halves."""
        length, d = x.size(-2), x.size(-1)
        inv = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
        ang = torch.arange(length, dtype=torch.float64)[:, None] * inv  # (L, d/2)
        ang = torch.cat((ang, ang), dim=-1).to(x.device)  # (L, d)
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        rotated = torch.cat((-x2, x1), dim=-1)
        return x * ang.cos().to(x.dtype) + rotated * ang.sin().to(x.dtype)

    def rotate_qk(self, q, k):
        return self.rotate(q), self.rotate(k)


@hookimpl
def harness_add_components():
    return [Component(NAME, "positional", HalfSplitRoPE, "RoPE, rotate_half layout", "adversarial test plugin",
                      differs="RoPE instead of the sinusoidal PE (RoFormer)", reference="rotary")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"positional": NAME}, summary="baseline with half-split RoPE declared as RoFormer's",
                    source="adversarial test plugin")]
