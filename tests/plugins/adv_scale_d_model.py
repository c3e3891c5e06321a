"""Adversarial plugin: attention that divides the scores by d_model instead of sqrt(d_k).

Fault: ``scores = Q K^T / d_model`` where Vaswani et al. 2017 §3.2.1 divide by ``sqrt(d_k)``
(d_k = d_model / h). With the check model (d_model 32, h 4, d_k 8) the logits are scaled by
sqrt(8) / 32 = 0.088 of what they should be: attention is much flatter than scaled dot-product
attention. Masks are applied correctly, so no probe leaks: only a comparison of the component
with its slot's reference (``nn.MultiheadAttention`` holding the same w_q, w_k, w_v, w_o) shows it.
The component is *not* declared buggy and declares no difference.

Expected: ``check`` fails with the attention component differing from nn.MultiheadAttention
(e.g. "attention=adv_scale_d_model ... differs unexpectedly ... nn.MultiheadAttention",
max |Δ output| far above the threshold).
"""
from __future__ import annotations

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_scale_d_model"
EXPECT_CHECK = "fail"
EXPECT_REASON = "attention differs from nn.MultiheadAttention (scores / d_model instead of / sqrt(d_k))"


class ScaleByDModelAttention(nn.Module):
    """Multi-head attention, heads (B, H, L, d_k), scores divided by d_model (the fault).

    Shape: query (B, Tq, D), key/value (B, Tk, D) -> (B, Tq, D). Parameters are canonical as
    they are (``w_q, w_k, w_v, w_o``).
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
        scores = torch.matmul(q, k.transpose(-2, -1)) / self.d_model  # FAULT: should be / math.sqrt(self.d_k)
        if mask is not None:
            scores = self.apply_mask(scores, mask)
        p = self.dropout(scores.softmax(dim=-1))  # (B, H, Tq, Tk)
        x = torch.matmul(p, v).transpose(1, 2).reshape(b, -1, self.h * self.d_k)  # (B, Tq, D)
        return self.w_o(x)


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", ScaleByDModelAttention,
                      "multi-head attention, scores / d_model", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME}, summary="baseline with attention scaled by 1/d_model",
                    source="adversarial test plugin")]
