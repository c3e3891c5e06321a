"""Correct plugin: multi-query attention (Shazeer 2019), written from docs/components.md's recipe for a
component with parameter shapes of its own.

One key/value head of width d_k shared by all h query heads: ``w_k``, ``w_v`` are (d_k, D) instead of
(D, D). Nothing is declared: the attention slot's reference reads the number of K/V heads from the
exported ``w_k`` rows (n_kv = 1 here), and the canonical names are the slot's (``w_q``, ``w_k``, ``w_v``,
``w_o``) with their own shapes.

Expected: ``check --variants good_mqa baseline`` exits 0 with no flags; good_mqa stands in an
equivalence class of its own (no canonical counterpart in a multi-head variant); ``run`` marks it valid.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "good_mqa"
EXPECT_CHECK = "pass"
EXPECT_REASON = ""


class MultiQueryAttention(nn.Module):
    """h query heads, one K/V head. Shape: query (B, Tq, D), key/value (B, Tk, D) -> (B, Tq, D)."""

    def __init__(self, ctx):
        super().__init__()
        d = ctx.cfg.d_model
        self.h, self.d_k = ctx.cfg.h, d // ctx.cfg.h
        self.w_q, self.w_o = ctx.linear(d, d), ctx.linear(d, d)
        self.w_k, self.w_v = ctx.linear(d, self.d_k), ctx.linear(d, self.d_k)  # one K/V head: (d_k, D)
        self.apply_mask = ctx.mask.apply
        self.positions = ctx.positions
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def forward(self, query, key, value, mask=None):
        b, tq = query.size(0), query.size(1)
        q = self.w_q(query).view(b, tq, self.h, self.d_k).transpose(1, 2)  # (B, H, Tq, d_k)
        k = self.w_k(key)[:, None]  # (B, 1, Tk, d_k): broadcast over the query heads
        v = self.w_v(value)[:, None]  # (B, 1, Tk, d_k)
        q, k = self.positions.rotate(q, k)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.d_k)  # (B, H, Tq, Tk)
        scores = self.positions.bias(scores)
        if mask is not None:
            scores = self.apply_mask(scores, mask)
        x = torch.matmul(self.dropout(scores.softmax(dim=-1)), v)  # (B, H, Tq, d_k)
        return self.w_o(x.transpose(1, 2).reshape(b, tq, self.h * self.d_k))  # (B, Tq, D)


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", MultiQueryAttention, "multi-query attention: one K/V head (d_k, D)",
                      "Shazeer 2019 (test plugin)")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME}, summary="baseline with multi-query attention",
                    source="test plugin")]
