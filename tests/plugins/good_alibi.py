"""Correct plugin: ALiBi written from scratch from docs/components.md's slope rule (Press et al. 2022 §3).

-m_h |i - j| added to head h's scaled scores; the slopes: for h a power of 2 the geometric sequence
2^(-8/h), 2^(-16/h), ..., 2^(-8); otherwise the slopes for the power of 2 below h (n), then every other
slope of the sequence for 2n (its first, third, ... entries) until h slopes. x * sqrt(D) on the
embeddings. Declares ``reference="linear_biases"``; does not claim ``equivalent_to="alibi"``.

Expected: ``check --variants good_alibi alibi_positions`` exits 0 and the two share one class, at any
h (``tests/test_shapes.py`` writes it again at h = 6).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "good_alibi"
TWIN = "alibi_positions"
EXPECT_CHECK = "pass"
EXPECT_REASON = ""


def slopes(h: int) -> list[float]:
    """The docs' rule: geometric from 2^(-8/n) with ratio 2^(-8/n); non-powers of 2 interleaved from 2n."""
    def geometric(n):
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]

    n = 1 << (h.bit_length() - 1)
    return geometric(n) + geometric(2 * n)[0::2][: h - n]


class ALiBi(nn.Module):
    """x * sqrt(D) on the embeddings (B, L, D); ``score_bias`` (H, Tq, Tk)."""

    def __init__(self, ctx):
        super().__init__()
        self.h = ctx.cfg.h
        self.scale = math.sqrt(ctx.cfg.d_model)
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def forward(self, x):
        return self.dropout(x * self.scale)

    def score_bias(self, tq, tk, device, dtype):
        i = torch.arange(tq, device=device, dtype=torch.float64)[:, None]
        j = torch.arange(tk, device=device, dtype=torch.float64)[None, :]
        m = torch.tensor(slopes(self.h), dtype=torch.float64, device=device)[:, None, None]
        return (-m * (i - j).abs()).to(dtype)


@hookimpl
def harness_add_components():
    return [Component(NAME, "positional", ALiBi, "ALiBi from the docs' slope rule", "Press et al. 2022 (test plugin)",
                      differs="linear score biases instead of additive PE", reference="linear_biases")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"positional": NAME}, summary="baseline with a from-scratch ALiBi", source="test plugin")]
