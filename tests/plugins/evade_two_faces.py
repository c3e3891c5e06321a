"""Evasive plugin: an attention factory that hands out two different attentions.

Fault: the factory alternates between the model-building contexts it sees (one
``BuildContext`` per model build): the 1st, 3rd, 5th ... get an attention whose scores are divided
by d_model instead of sqrt(d_k) (adv_scale_d_model's fault); the 2nd, 4th ... get a correct one.
Whichever instance a contract check happens to build can be the honest one while the model a
trial trains is the other. Both share one class (the fault is a per-instance flag), so a check of
the class alone sees nothing. Deliberate cheating, documented as such; not declared buggy.

Expected: ``run`` marks it invalid before training: a second build of the variant from the same
seed is not the same model (``harness.checks.gate.twin_reasons``: same weights, other outputs).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "evade_two_faces"
EXPECT_CHECK = "either"
EXPECT_REASON = "the factory returns a wrong attention for every other model build"
_SEEN: list = []  # the BuildContexts seen, in order; held (not their ids: a freed one's id is reused)


class TwoFacedAttention(nn.Module):
    """Multi-head attention, heads (B, H, L, d_k); ``honest`` picks sqrt(d_k) or d_model (the fault).

    Shape: query (B, Tq, D), key/value (B, Tk, D) -> (B, Tq, D). Canonical ``w_q, w_k, w_v, w_o``.
    """

    def __init__(self, ctx):
        super().__init__()
        if not any(seen is ctx for seen in _SEEN):
            _SEEN.append(ctx)
        index = next(i for i, seen in enumerate(_SEEN) if seen is ctx)
        self.honest = index % 2 == 1  # FAULT: every other build gets the wrong scale
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
        scale = math.sqrt(self.d_k) if self.honest else self.d_model
        scores = torch.matmul(q, k.transpose(-2, -1)) / scale
        if mask is not None:
            scores = self.apply_mask(scores, mask)
        p = self.dropout(scores.softmax(dim=-1))  # (B, H, Tq, Tk)
        x = torch.matmul(p, v).transpose(1, 2).reshape(b, -1, self.h * self.d_k)  # (B, Tq, D)
        return self.w_o(x)


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", TwoFacedAttention, "multi-head attention, two faces",
                      "evasive test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME}, summary="baseline with an attention factory of two faces",
                    source="evasive test plugin")]
