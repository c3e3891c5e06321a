"""Adversarial plugin: attention that drops the mask exactly in a training step.

Fault: ``forward`` takes a "fast training path" -- ``F.scaled_dot_product_attention(q, k, v,
dropout_p=p)`` with no ``attn_mask`` -- whenever ``self.training and torch.is_grad_enabled()``;
everywhere else (eval mode, or train mode under ``torch.no_grad()`` / ``torch.inference_mode()``)
it runs the ordinary explicit attention with the mask. So it is causal and padding-masked in
every forward that a check typically runs (eval-mode comparisons with gradients; train-mode
probes under ``no_grad``; ``decoder_is_causal`` under ``inference_mode``) and masks nothing --
neither future tokens nor padding -- in the forward/backward of a real training step. The
trigger is the sneakiest one available: it is exactly "a training step", not a detail of the
check batch (size, length, dtype). It looks like a real bug (a fused path that forgot to pass the
mask). Not declared buggy.

Expected: ``check`` fails with a causal (and padding) leak found in train mode *with autograd
enabled*, e.g. "decoder position p changed ... (train mode, grad enabled)" or a gradient probe
"d logits[p] / d target token after p is non-zero". A check whose train-mode probes run under
``no_grad`` misses it.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from harness import Component, Variant, hookimpl

NAME = "adv_eval_only_mask"
EXPECT_CHECK = "fail"
EXPECT_REASON = "no mask in a training step (train mode + grad enabled): causal and padding leak"


class TrainStepUnmaskedAttention(nn.Module):
    """Multi-head attention whose train-with-grad path skips the mask (the fault).

    Shape: query (B, Tq, D), key/value (B, Tk, D) -> (B, Tq, D).
    """

    def __init__(self, ctx):
        super().__init__()
        d = ctx.cfg.d_model
        self.h, self.d_k = ctx.cfg.h, d // ctx.cfg.h
        self.w_q, self.w_k, self.w_v, self.w_o = (ctx.linear(d, d) for _ in range(4))
        self.apply_mask = ctx.mask.apply
        self.p = ctx.cfg.dropout
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.size(0), -1, self.h, self.d_k).transpose(1, 2)  # (B, L, D) -> (B, H, L, d_k)

    def forward(self, query, key, value, mask=None):
        b = query.size(0)
        q, k, v = self.split(self.w_q(query)), self.split(self.w_k(key)), self.split(self.w_v(value))
        if self.training and torch.is_grad_enabled():
            x = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p)  # FAULT: attn_mask forgotten
        else:
            scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.d_k)  # (B, H, Tq, Tk)
            if mask is not None:
                scores = self.apply_mask(scores, mask)
            x = torch.matmul(self.dropout(scores.softmax(dim=-1)), v)  # (B, H, Tq, d_k)
        return self.w_o(x.transpose(1, 2).reshape(b, -1, self.h * self.d_k))  # (B, Tq, D)


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", TrainStepUnmaskedAttention,
                      "multi-head attention with a fused training path", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME}, summary="baseline whose training path forgets the mask",
                    source="adversarial test plugin")]
