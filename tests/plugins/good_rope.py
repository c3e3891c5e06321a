"""Correct plugin: RoPE written from scratch from docs/components.md (RoFormer eq. 34, interleaved pairs).

The complex form: each pair (x_2i, x_2i+1) of a head's q and k read as x_2i + i x_2i+1 and multiplied by
exp(i pos theta_i), theta_i = 10000^(-2i/d_k); x * sqrt(D) on the embeddings. It declares its difference
from the sinusoidal PE and names the formula (``reference="rotary"``), as the docs say; it does not
claim ``equivalent_to="rope"``.

Expected: ``check --variants good_rope rope_positions`` exits 0 and, measured the same function, the
two share one equivalence class (classes come from measurement, not declarations).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "good_rope"
TWIN = "rope_positions"
EXPECT_CHECK = "pass"
EXPECT_REASON = ""


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
        return self.rotate(q), self.rotate(k)


@hookimpl
def harness_add_components():
    return [Component(NAME, "positional", ComplexRoPE, "RoPE in complex form, interleaved pairs",
                      "RoFormer eq. 34 (test plugin)", differs="rotary positions instead of additive PE",
                      reference="rotary")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"positional": NAME}, summary="baseline with a from-scratch RoPE", source="test plugin")]
