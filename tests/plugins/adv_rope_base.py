"""Adversarial plugin: RoPE with base 1000 where RoFormer uses 10000.

Fault: theta_i = 1000^(-2i/d_k). A rotation by position all the same (relative, norm-preserving), every
parameter used, no leak; declared as RoFormer's formula (``reference="rotary"``), which it is not.

Expected: ``check`` fails naming the base ("RoPE base 1000 instead of 10000").
"""
from __future__ import annotations

import math

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_rope_base"
EXPECT_CHECK = "fail"
EXPECT_REASON = "RoPE base 1000 instead of 10000"


class ComplexRoPE(nn.Module):
    """x * sqrt(D) on the embeddings (B, L, D); ``rotate_qk`` on q, k (..., L, d_k)."""

    def __init__(self, ctx):
        super().__init__()
        self.scale = math.sqrt(ctx.cfg.d_model)
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def forward(self, x):
        return self.dropout(x * self.scale)

    @staticmethod
    def rotate(x):
        length, d = x.size(-2), x.size(-1)
        theta = 1000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
        turn = torch.polar(torch.ones(length, d // 2, dtype=torch.float64),
                           torch.arange(length, dtype=torch.float64)[:, None] * theta)  # (L, d/2) complex
        pairs = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
        return torch.view_as_real(pairs * turn.to(x.device)).reshape(x.shape).to(x.dtype)

    def rotate_qk(self, q, k):
        return self.rotate(q), self.rotate(k)


@hookimpl
def harness_add_components():
    return [Component(NAME, "positional", ComplexRoPE, "RoPE, base 1000",
                      "RoFormer eq. 34 (adversarial test plugin)", differs="rotary positions instead of additive PE",
                      reference="rotary")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"positional": NAME}, summary="baseline with a from-scratch RoPE", source="adversarial test plugin")]
