"""Adversarial plugin: ALiBi with slopes linear in the head index (m_h = h / H).

Fault: slopes 1/H, 2/H, ..., 1 instead of the paper's geometric 2^(-8/H), 2^(-16/H), .... A penalty on
distance all the same, causal, no crash; declared as the paper's formula (``reference="linear_biases"``).

Expected: ``check`` fails naming the fault ("ALiBi slopes linear in the head index").
"""
from __future__ import annotations

import math

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_alibi_linear_slopes"
EXPECT_CHECK = "fail"
EXPECT_REASON = "ALiBi slopes linear in the head index"


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
        m = (torch.arange(1, self.h + 1, dtype=torch.float64, device=device) / self.h)[:, None, None]  # FAULT: linear
        return (-m * (i - j).abs()).to(dtype)


@hookimpl
def harness_add_components():
    return [Component(NAME, "positional", ALiBi, "ALiBi, linear slopes", "Press et al. 2022 (adversarial test plugin)",
                      differs="linear score biases instead of additive PE", reference="linear_biases")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"positional": NAME}, summary="baseline with a from-scratch ALiBi", source="adversarial test plugin")]
