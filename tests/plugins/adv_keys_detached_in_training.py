"""Adversarial plugin: attention whose keys are cut from the gradient in training only.

Fault: in training mode ``k = w_k(key).detach()``: the forward is the paper's scaled dot-product
attention in both modes, but in training no gradient reaches ``w_k`` (nor, through the keys, the
layers below), so ``w_k`` never trains. Every gradient a check computes is taken in evaluation mode
(the model contract's "every parameter gets a gradient", check's pairs), where the keys are not
detached, so such a component used to pass ``check`` and be classed "same function" as the
baseline. Deliberate check-gaming; not declared buggy.

Expected: ``check`` fails on "training = evaluation (dropout 0)": the logits agree, the gradients
do not, and ``w_k`` "gets none in training"; ``run`` marks the variant invalid.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_keys_detached_in_training"
EXPECT_CHECK = "fail"
EXPECT_REASON = "keys detached in training: same forward, w_k gets no gradient in training"


class DetachedKeysAttention(nn.Module):
    """Multi-head attention, heads (B, H, L, d_k); keys detached in training (the fault).

    Shape: query (B, Tq, D), key/value (B, Tk, D) -> (B, Tq, D). Canonical ``w_q, w_k, w_v, w_o``.
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
        k = self.w_k(key)
        if self.training:
            k = k.detach()  # FAULT: no gradient to w_k in training
        q, k, v = self.split(self.w_q(query)), self.split(k), self.split(self.w_v(value))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.d_k)
        if mask is not None:
            scores = self.apply_mask(scores, mask)
        p = self.dropout(scores.softmax(dim=-1))  # (B, H, Tq, Tk)
        x = torch.matmul(p, v).transpose(1, 2).reshape(b, -1, self.h * self.d_k)  # (B, Tq, D)
        return self.w_o(x)


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", DetachedKeysAttention,
                      "multi-head attention (keys detached in training)", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME}, summary="baseline with its keys detached in training",
                    source="adversarial test plugin")]
