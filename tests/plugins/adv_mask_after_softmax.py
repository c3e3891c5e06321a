"""Adversarial plugin: the mask applied to the probabilities *after* the softmax, not renormalised.

Fault: ``p = softmax(scores)`` over every key, then the blocked weights are set to 0
(``p.masked_fill(blocked, 0)``) without dividing by the new row sum. The output at query q no
longer reads blocked values directly, but every kept weight is exp(s_qk) / sum over *all* keys,
future and padded ones included, so earlier outputs still depend on future and padded tokens
through the denominator (a causal and a padding leak), and the rows sum to less than 1. The
blocked positions are found in a convention-free way: ``ctx.mask.apply(zeros, mask) < 0``.
Not declared buggy.

Expected: ``check`` fails with a causal leak ("decoder position p changed ...") and a padding leak
("real target positions changed ... when the tokens at padded source positions changed"), and the
attention differing from nn.MultiheadAttention.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_mask_after_softmax"
EXPECT_CHECK = "fail"
EXPECT_REASON = "mask zeroes softmax weights without renormalising: denominators see the future"


class MaskAfterSoftmaxAttention(nn.Module):
    """Multi-head attention masking the probabilities after the softmax (the fault).

    Shape: query (B, Tq, D), key/value (B, Tk, D) -> (B, Tq, D).
    """

    def __init__(self, ctx):
        super().__init__()
        d = ctx.cfg.d_model
        self.h, self.d_k = ctx.cfg.h, d // ctx.cfg.h
        self.w_q, self.w_k, self.w_v, self.w_o = (ctx.linear(d, d) for _ in range(4))
        self.apply_mask = ctx.mask.apply
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.size(0), -1, self.h, self.d_k).transpose(1, 2)  # (B, L, D) -> (B, H, L, d_k)

    def forward(self, query, key, value, mask=None):
        b = query.size(0)
        q, k, v = self.split(self.w_q(query)), self.split(self.w_k(key)), self.split(self.w_v(value))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.d_k)  # (B, H, Tq, Tk)
        p = scores.softmax(dim=-1)  # FAULT: softmax before masking
        if mask is not None:
            blocked = self.apply_mask(torch.zeros_like(p), mask) < 0  # (B or 1, H or 1, Tq, Tk)
            p = p.masked_fill(blocked, 0.0)  # FAULT: no renormalisation
        x = torch.matmul(self.dropout(p), v).transpose(1, 2).reshape(b, -1, self.h * self.d_k)  # (B, Tq, D)
        return self.w_o(x)


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", MaskAfterSoftmaxAttention,
                      "multi-head attention, mask zeroes weights after softmax", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME}, summary="baseline masking attention weights after the softmax",
                    source="adversarial test plugin")]
