"""Adversarial plugin: attention that is scaled dot-product attention except under ``torch.inference_mode``.

Fault: under ``torch.inference_mode`` (how held-out evaluation and decoding run the model) the scores
are divided by d_model instead of sqrt(d_k). The component contracts run under ``no_grad``, the
pairs and the training-mode comparison with autograd on, and the eval-mode probes compare two
forwards that are both under inference mode (so both wrong the same way, no leak): all of them see
or accept the paper's attention, while every held-out score comes from another function, and a
variant classed "same function" as the baseline would be scored as something else. Deliberate
check-gaming; not declared buggy.

Expected: ``check`` fails on "training = evaluation (dropout 0)": the evaluation-mode logits under
``torch.inference_mode`` differ from those with autograd on; ``run`` marks the variant invalid.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_scale_in_inference"
EXPECT_CHECK = "fail"
EXPECT_REASON = "scores / d_model under torch.inference_mode (held-out evaluation), / sqrt(d_k) otherwise"


class NoGradScaleAttention(nn.Module):
    """Multi-head attention, heads (B, H, L, d_k); scores / d_model under inference mode (the fault).

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
        scale = self.d_model if torch.is_inference_mode_enabled() else math.sqrt(self.d_k)  # FAULT
        scores = torch.matmul(q, k.transpose(-2, -1)) / scale
        if mask is not None:
            scores = self.apply_mask(scores, mask)
        p = self.dropout(scores.softmax(dim=-1))  # (B, H, Tq, Tk)
        x = torch.matmul(p, v).transpose(1, 2).reshape(b, -1, self.h * self.d_k)  # (B, Tq, D)
        return self.w_o(x)


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", NoGradScaleAttention,
                      "multi-head attention (scores / d_model under inference mode)", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME}, summary="baseline with attention scaled by 1/d_model under inference mode",
                    source="adversarial test plugin")]
