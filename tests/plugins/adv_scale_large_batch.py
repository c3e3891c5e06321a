"""Adversarial plugin: attention that is scaled dot-product attention only in small batches.

Fault: for batches of more than 8 rows the scores are divided by d_model instead of sqrt(d_k). The
component contracts and check's pairs use batches of 3-6 rows, so they see the paper's attention;
training batches (16-128 rows) and held-out evaluation chunks get the other one. Unlike
adv_batch_size_gaming (a mask that is causal only for small batches) nothing leaks: the model is
causal at every size, only another function. Deliberate check-gaming; not declared buggy.

Expected: ``check`` fails: the eval-mode causal probe, which evaluates its changed targets stacked
into one large batch, sees the logits move, and its control (the unchanged batch stacked the same
way) moves too, so the failure says the model's output depends on the batch it is in (not that it
sees the future); ``run`` marks the variant invalid.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_scale_large_batch"
EXPECT_CHECK = "fail"
EXPECT_REASON = "scores / d_model in batches of more than 8 rows: the output depends on the batch size"


class NoGradScaleAttention(nn.Module):
    """Multi-head attention, heads (B, H, L, d_k); scores / d_model when B > 8 (the fault).

    Shape: query (B, Tq, D), key/value (B, Tk, D) -> (B, Tq, D). Canonical ``w_q, w_k, w_v, w_o``.
    """

    def __init__(self, ctx):
        super().__init__()
        d = ctx.cfg.d_model
        self.d_model, self.h, self.d_k = d, ctx.cfg.h, d // ctx.cfg.h
        self.w_q, self.w_k, self.w_v, self.w_o = (ctx.linear(d, d) for _ in range(4))
        self.apply_mask = ctx.mask.apply
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.size(0), -1, self.h, self.d_k).transpose(1, 2)  # (B, L, D) -> (B, H, L, d_k)

    def forward(self, query, key, value, mask=None):
        b = query.size(0)
        q, k, v = self.split(self.w_q(query)), self.split(self.w_k(key)), self.split(self.w_v(value))
        scale = self.d_model if query.size(0) > 8 else math.sqrt(self.d_k)  # FAULT: batch-size branch
        scores = torch.matmul(q, k.transpose(-2, -1)) / scale
        if mask is not None:
            scores = self.apply_mask(scores, mask)
        p = self.dropout(scores.softmax(dim=-1))  # (B, H, Tq, Tk)
        x = torch.matmul(p, v).transpose(1, 2).reshape(b, -1, self.h * self.d_k)  # (B, Tq, D)
        return self.w_o(x)


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", NoGradScaleAttention,
                      "multi-head attention (scores / d_model in large batches)", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME}, summary="baseline with attention scaled by 1/d_model in batches of more than 8 rows",
                    source="adversarial test plugin")]
