"""Adversarial plugin: attention that splits heads with ``.view(B, h, L, d_k)`` (no transpose).

Fault: the projections (B, L, D) are reshaped straight to (B, H, L, d_k) with ``view`` instead of
``view(B, L, H, d_k).transpose(1, 2)``; the output is merged back with the matching
``view(B, L, D)`` (again no transpose), so shapes line up everywhere and nothing crashes. But row l
of head i of the reshaped tensor holds the slice ``flat[(i * L + l) * d_k : ... + d_k]`` of the
(L, D) matrix, i.e. parts of positions (i * L + l) * d_k // D ...: each "position" of each head
mixes features of several positions, so the causal mask is applied to the wrong positions and
future tokens leak into earlier outputs. Not declared buggy.

Expected: ``check`` fails with a causal leak ("decoder position p changed ... causal mask not
applied") and the attention differing from nn.MultiheadAttention.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_heads_no_transpose"
EXPECT_CHECK = "fail"
EXPECT_REASON = "heads split with view(B, h, L, d_k): positions mixed, causal leak"


class NoTransposeAttention(nn.Module):
    """Multi-head attention whose head split is a bare ``view`` (the fault).

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
        return x.view(x.size(0), self.h, x.size(1), self.d_k)  # FAULT: (B, L, D) -> "(B, H, L, d_k)" without transpose

    def forward(self, query, key, value, mask=None):
        b, tq = query.size(0), query.size(1)
        q, k, v = self.split(self.w_q(query)), self.split(self.w_k(key)), self.split(self.w_v(value))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.d_k)  # (B, H, Tq, Tk)
        if mask is not None:
            scores = self.apply_mask(scores, mask)
        x = torch.matmul(self.dropout(scores.softmax(dim=-1)), v)  # (B, H, Tq, d_k)
        return self.w_o(x.reshape(b, tq, self.h * self.d_k))  # FAULT (matching): no transpose back


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", NoTransposeAttention,
                      "multi-head attention, heads split with view only", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME}, summary="baseline with heads split without a transpose",
                    source="adversarial test plugin")]
