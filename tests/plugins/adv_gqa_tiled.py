"""Adversarial plugin: grouped-query attention whose K/V heads are tiled instead of grouped.

Fault: the n_kv K/V heads are expanded to h with ``k.repeat(1, h // n_kv, 1, 1)`` (query head i reads
K/V head i % n_kv) where LLaMA's ``repeat_kv`` (``repeat_interleave`` over the head axis) gives query
head i the K/V head i // (h / n_kv). Every parameter is used and gets a gradient, the masks are right
and nothing crashes; it is simply another function of the same weights (a checkpoint converted from a
LLaMA model would give other outputs). Not declared buggy. n_kv = h / 2 (2 at the check's h = 4).

Expected: ``check`` fails with the fault named ("K/V heads tiled with repeat()").
"""
from __future__ import annotations

import math

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_gqa_tiled"
EXPECT_CHECK = "fail"
EXPECT_REASON = "K/V heads tiled with repeat() instead of repeat_interleave"


class TiledGQA(nn.Module):
    """GQA with ``repeat`` (the fault). Shape: query (B, Tq, D), key/value (B, Tk, D) -> (B, Tq, D)."""

    def __init__(self, ctx):
        super().__init__()
        d = ctx.cfg.d_model
        self.h, self.d_k = ctx.cfg.h, d // ctx.cfg.h
        self.n_kv = max(1, self.h // 2)
        self.w_q, self.w_o = ctx.linear(d, d), ctx.linear(d, d)
        self.w_k, self.w_v = ctx.linear(d, self.n_kv * self.d_k), ctx.linear(d, self.n_kv * self.d_k)
        self.apply_mask = ctx.mask.apply
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def split(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        return x.view(x.size(0), x.size(1), heads, self.d_k).transpose(1, 2)  # (B, L, heads*d_k) -> (B, heads, L, d_k)

    def forward(self, query, key, value, mask=None):
        b, tq = query.size(0), query.size(1)
        q = self.split(self.w_q(query), self.h)  # (B, H, Tq, d_k)
        k = self.split(self.w_k(key), self.n_kv).repeat(1, self.h // self.n_kv, 1, 1)  # FAULT: tiled (B, H, Tk, d_k)
        v = self.split(self.w_v(value), self.n_kv).repeat(1, self.h // self.n_kv, 1, 1)  # FAULT
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.d_k)  # (B, H, Tq, Tk)
        if mask is not None:
            scores = self.apply_mask(scores, mask)
        x = torch.matmul(self.dropout(scores.softmax(dim=-1)), v)  # (B, H, Tq, d_k)
        return self.w_o(x.transpose(1, 2).reshape(b, tq, self.h * self.d_k))  # (B, Tq, D)


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", TiledGQA, "grouped-query attention, K/V heads tiled with repeat()",
                      "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME}, summary="baseline with tiled (not grouped) K/V heads",
                    source="adversarial test plugin")]
