"""Adversarial plugin: attention whose softmax runs over the query axis (``dim=-2``).

Fault: ``scores.softmax(dim=-2)`` normalises each *key column* over the queries instead of each
query row over the keys. Blocked entries still get weight ~0, but the weight of a kept key k for
query q is divided by a sum over every query q' -- including future queries, whose scores depend
on future target tokens -- so earlier outputs depend on later tokens (a causal leak), and rows no
longer sum to 1. Not declared buggy.

Expected: ``check`` fails with a causal leak ("decoder position p changed ... when the target
tokens after position p changed") and the attention differing from nn.MultiheadAttention.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_softmax_dim"
EXPECT_CHECK = "fail"
EXPECT_REASON = "softmax over queries (dim=-2): causal leak, differs from nn.MultiheadAttention"


class QueryAxisSoftmaxAttention(nn.Module):
    """Multi-head attention with the softmax over dim -2 (the fault).

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
        if mask is not None:
            scores = self.apply_mask(scores, mask)
        p = self.dropout(scores.softmax(dim=-2))  # FAULT: should be dim=-1 (over keys)
        x = torch.matmul(p, v).transpose(1, 2).reshape(b, -1, self.h * self.d_k)  # (B, Tq, D)
        return self.w_o(x)


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", QueryAxisSoftmaxAttention,
                      "multi-head attention, softmax over dim=-2", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME}, summary="baseline with the attention softmax over queries",
                    source="adversarial test plugin")]
