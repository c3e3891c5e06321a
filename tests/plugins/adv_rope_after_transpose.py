"""Adversarial plugin: an attention that applies RoPE to k after transposing it for Q K^T.

Fault: ``kt = k.transpose(-2, -1)`` (B, H, d_k, Tk) is handed to the rotation, so positions are taken
along d_k and the rotated "pairs" run along the keys: keys 2i and 2i+1 are mixed, so query 2i also sees
key 2i+1 (a future leak the probes see too). The shapes work whenever Tk is even (the check's
self-attention has T = 10), and with additive positions ``rotate`` is a no-op, so the bug hides until a
RoPE variant uses it. Not declared buggy.

Expected: ``check`` fails naming "RoPE applied to k after the transpose for Q K^T".
"""
from __future__ import annotations

import math

from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_rope_after_transpose"
EXPECT_CHECK = "fail"
EXPECT_REASON = "RoPE applied to k^T (positions along d_k)"


class TransposedKeyRoPEAttention(nn.Module):
    """Multi-head attention, heads (B, H, L, d_k), RoPE on q and on k^T (the fault)."""

    def __init__(self, ctx):
        super().__init__()
        d = ctx.cfg.d_model
        self.h, self.d_k = ctx.cfg.h, d // ctx.cfg.h
        self.w_q, self.w_k, self.w_v, self.w_o = (ctx.linear(d, d) for _ in range(4))
        self.apply_mask = ctx.mask.apply
        self.positions = ctx.positions
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def split(self, x):
        return x.view(x.size(0), -1, self.h, self.d_k).transpose(1, 2)  # (B, L, D) -> (B, H, L, d_k)

    def forward(self, query, key, value, mask=None):
        b = query.size(0)
        q, k, v = self.split(self.w_q(query)), self.split(self.w_k(key)), self.split(self.w_v(value))
        q, kt = self.positions.rotate(q, k.transpose(-2, -1))  # FAULT: rotate k, then transpose
        scores = self.positions.bias(q @ kt / math.sqrt(self.d_k))  # (B, H, Tq, Tk)
        if mask is not None:
            scores = self.apply_mask(scores, mask)
        x = self.dropout(scores.softmax(dim=-1)) @ v  # (B, H, Tq, d_k)
        return self.w_o(x.transpose(1, 2).reshape(b, -1, self.h * self.d_k))  # (B, Tq, D)


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", TransposedKeyRoPEAttention, "attention with RoPE on k after the transpose",
                      "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME, "positional": "rope"}, summary="RoPE variant whose attention rotates k^T",
                    source="adversarial test plugin")]
