"""Adversarial plugin: attention with the key and value projections swapped.

Fault: keys are projected with ``w_v`` and values with ``w_k`` (``k = w_v(key)``,
``v = w_k(value)``). Both projections are used, every canonical parameter gets a gradient and the
masks are right, so no probe leaks and nothing crashes; but against the canonical layout (and
``nn.MultiheadAttention`` holding the same ``w_q, w_k, w_v, w_o``) it is a different function.
Not declared buggy.

Expected: ``check`` fails with the attention differing from nn.MultiheadAttention
("differs unexpectedly", max |Δ output| far above the threshold).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_kv_swapped"
EXPECT_CHECK = "fail"
EXPECT_REASON = "attention differs from nn.MultiheadAttention (K and V projections swapped)"


class SwappedKVAttention(nn.Module):
    """Multi-head attention with w_k and w_v exchanged (the fault).

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
        q = self.split(self.w_q(query))
        k = self.split(self.w_v(key))  # FAULT: should be w_k
        v = self.split(self.w_k(value))  # FAULT: should be w_v
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.d_k)  # (B, H, Tq, Tk)
        if mask is not None:
            scores = self.apply_mask(scores, mask)
        x = torch.matmul(self.dropout(scores.softmax(dim=-1)), v)  # (B, H, Tq, d_k)
        return self.w_o(x.transpose(1, 2).reshape(b, -1, self.h * self.d_k))  # (B, Tq, D)


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", SwappedKVAttention,
                      "multi-head attention, keys through w_v and values through w_k", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME}, summary="baseline with K and V projections swapped",
                    source="adversarial test plugin")]
