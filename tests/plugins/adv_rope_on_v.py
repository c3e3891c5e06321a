"""Adversarial plugin: an attention that rotates the values with RoPE too.

Fault: written for the contract (it asks ``ctx.positions`` for the rotation), it also passes the values
through it: ``v, _ = self.positions.rotate(v, v)``. RoFormer (§3.4.2) rotates queries and keys only --
that is what makes the scores depend on relative positions; rotated values make the output depend on
absolute positions. With sinusoidal or learned positions ``rotate`` is a no-op, so the bug hides until
a RoPE variant uses it. Not declared buggy; the variant uses the built-in ``rope``.

Expected: ``check`` fails naming "RoPE applied to the values too".
"""
from __future__ import annotations

import math

from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_rope_on_v"
EXPECT_CHECK = "fail"
EXPECT_REASON = "RoPE applied to the values as well as q and k"


class RotatedValuesAttention(nn.Module):
    """Multi-head attention, heads (B, H, L, d_k), RoPE on q, k -- and on v (the fault)."""

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
        q, k = self.positions.rotate(q, k)
        v, _ = self.positions.rotate(v, v)  # FAULT: the values are not rotated
        scores = self.positions.bias(q @ k.transpose(-2, -1) / math.sqrt(self.d_k))  # (B, H, Tq, Tk)
        if mask is not None:
            scores = self.apply_mask(scores, mask)
        x = self.dropout(scores.softmax(dim=-1)) @ v  # (B, H, Tq, d_k)
        return self.w_o(x.transpose(1, 2).reshape(b, -1, self.h * self.d_k))  # (B, Tq, D)


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", RotatedValuesAttention, "attention with RoPE on q, k and v",
                      "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME, "positional": "rope"}, summary="RoPE variant whose attention rotates v",
                    source="adversarial test plugin")]
