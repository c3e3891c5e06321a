"""Adversarial plugin: attention that is scaled dot-product attention in evaluation only.

Fault: in training mode the scores are divided by d_model (adv_scale_d_model's fault); in evaluation
mode by sqrt(d_k), as Vaswani et al. 2017 §3.2.1 say. Every comparison with a reference runs in
evaluation mode (the attention contract, ``nn.MultiheadAttention``, ``nn.Transformer``, check's
pairs), and no probe leaks (masks are applied in both modes), so such a component used to pass
``check`` and be classed "same function" as the baseline: ``run`` would then have trained a
different model and reported it as the baseline's function, with no verdict. Deliberate
check-gaming; not declared buggy.

Expected: ``check`` fails on the model contract item "training = evaluation (dropout 0)" (the
training-mode logits differ from the evaluation-mode ones); ``run`` marks the variant invalid.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_scale_in_training"
EXPECT_CHECK = "fail"
EXPECT_REASON = "scores / d_model in training, / sqrt(d_k) in evaluation: the training forward differs"


class TrainingScaleAttention(nn.Module):
    """Multi-head attention, heads (B, H, L, d_k); scores / sqrt(d_k) in eval, / d_model in training.

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
        scale = self.d_model if self.training else math.sqrt(self.d_k)  # FAULT: d_model in training
        scores = torch.matmul(q, k.transpose(-2, -1)) / scale
        if mask is not None:
            scores = self.apply_mask(scores, mask)
        p = self.dropout(scores.softmax(dim=-1))  # (B, H, Tq, Tk)
        x = torch.matmul(p, v).transpose(1, 2).reshape(b, -1, self.h * self.d_k)  # (B, Tq, D)
        return self.w_o(x)


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", TrainingScaleAttention,
                      "multi-head attention (scores / d_model in training)", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME}, summary="baseline with attention scaled by 1/d_model in training",
                    source="adversarial test plugin")]
