"""Adversarial plugin: attention dropout through ``F.dropout`` without ``training=self.training``.

Fault: the attention weights go through ``F.dropout(p_attn, self.p)``; ``F.dropout``'s
``training`` argument defaults to True, so dropout stays active in eval mode (``model.eval()``
has no effect on it). With dropout > 0 every eval-mode forward is random: evaluation, greedy
decoding and any eval-mode comparison change from call to call. With dropout = 0 (the ``quick``
preset) it is harmless, so it hides in configs without dropout. The masks are right. A real
slip (the functional form needs the flag; ``nn.Dropout`` does not). Not declared buggy.

Expected: ``check`` fails because eval mode is not deterministic ("two eval-mode forwards of the
same batch differ: dropout active in eval mode?"); a check that blames it on the mask ("causal
mask not applied") is catching it for the wrong reason.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from harness import Component, Variant, hookimpl

NAME = "adv_functional_dropout"
EXPECT_CHECK = "fail"
EXPECT_REASON = "dropout active in eval mode (F.dropout without training=self.training)"


class EvalDropoutAttention(nn.Module):
    """Multi-head attention whose weight dropout ignores eval mode (the fault).

    Shape: query (B, Tq, D), key/value (B, Tk, D) -> (B, Tq, D).
    """

    def __init__(self, ctx):
        super().__init__()
        d = ctx.cfg.d_model
        self.h, self.d_k = ctx.cfg.h, d // ctx.cfg.h
        self.w_q, self.w_k, self.w_v, self.w_o = (ctx.linear(d, d) for _ in range(4))
        self.apply_mask = ctx.mask.apply
        self.p = ctx.cfg.dropout

    def split(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.size(0), -1, self.h, self.d_k).transpose(1, 2)  # (B, L, D) -> (B, H, L, d_k)

    def forward(self, query, key, value, mask=None):
        b = query.size(0)
        q, k, v = self.split(self.w_q(query)), self.split(self.w_k(key)), self.split(self.w_v(value))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.d_k)  # (B, H, Tq, Tk)
        if mask is not None:
            scores = self.apply_mask(scores, mask)
        p_attn = F.dropout(scores.softmax(dim=-1), self.p)  # FAULT: training=self.training missing
        x = torch.matmul(p_attn, v).transpose(1, 2).reshape(b, -1, self.h * self.d_k)  # (B, Tq, D)
        return self.w_o(x)


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", EvalDropoutAttention,
                      "multi-head attention, functional dropout on the weights", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME}, summary="baseline whose attention dropout is on in eval mode",
                    source="adversarial test plugin")]
