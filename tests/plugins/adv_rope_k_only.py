"""Adversarial plugin: RoPE that rotates the keys only.

Fault: ``rotate_qk`` returns (q, rotate(k)). The scores still depend on positions (absolute, not
relative), nothing leaks and nothing crashes; declared as RoFormer's formula (``reference="rotary"``).

Expected: ``check`` fails naming the fault ("RoPE applied to k only").
"""
from __future__ import annotations

import math

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_rope_k_only"
EXPECT_CHECK = "fail"
EXPECT_REASON = "RoPE applied to k only"


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
        theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
        turn = torch.polar(torch.ones(length, d // 2, dtype=torch.float64),
                           torch.arange(length, dtype=torch.float64)[:, None] * theta)  # (L, d/2) complex
        pairs = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
        return torch.view_as_real(pairs * turn.to(x.device)).reshape(x.shape).to(x.dtype)

    def rotate_qk(self, q, k):
        return q, self.rotate(k)  # FAULT: q is not rotated


@hookimpl
def harness_add_components():
    return [Component(NAME, "positional", ComplexRoPE, "RoPE on k only",
                      "RoFormer eq. 34 (adversarial test plugin)", differs="rotary positions instead of additive PE",
                      reference="rotary")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"positional": NAME}, summary="baseline with a from-scratch RoPE", source="adversarial test plugin")]
