"""Adversarial plugin: ALiBi with the slopes of another number of heads.

Fault: the slopes are computed for 8 heads (the paper's example, 1/2, 1/4, ..., 1/256) and the first h
of them used, whatever ``h`` is: at h = 4 the heads get 1/2, 1/4, 1/8, 1/16 where Press et al. 2022
(§3) give 1/4, 1/16, 1/64, 1/256 -- a hard-coded head count copied from a config with 8 heads. Every
head still gets a linear, causal, negative bias, so nothing leaks and the model trains; it is just not
ALiBi at this h. Declares ALiBi (``differs=... reference="linear_biases"``). Not declared buggy.

Expected: ``check`` fails naming "ALiBi slopes computed for 8 heads instead of h = 4".
"""
from __future__ import annotations

import math

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_alibi_wrong_heads"
EXPECT_CHECK = "fail"
EXPECT_REASON = "ALiBi slopes of 8 heads used with h = 4"


class WrongHeadsALiBi(nn.Module):
    """x * sqrt(D) on the embeddings; -m |i - j| with m from 8 heads' slopes (the fault)."""

    heads_for_slopes = 8  # FAULT: should be ctx.cfg.h

    def __init__(self, ctx):
        super().__init__()
        self.h = ctx.cfg.h
        self.scale = math.sqrt(ctx.cfg.d_model)
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def forward(self, x):
        return self.dropout(x * self.scale)

    def score_bias(self, tq, tk, device, dtype):
        n = self.heads_for_slopes
        slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / n) for i in range(n)])[: self.h]  # (H,)
        dist = (torch.arange(tq)[:, None] - torch.arange(tk)[None, :]).abs()  # (Tq, Tk)
        return (-slopes[:, None, None] * dist).to(device, dtype)


@hookimpl
def harness_add_components():
    return [Component(NAME, "positional", WrongHeadsALiBi, "ALiBi with 8 heads' slopes", "adversarial test plugin",
                      differs="ALiBi instead of the sinusoidal PE (Press et al. 2022)", reference="linear_biases")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"positional": NAME}, summary="baseline with ALiBi slopes for the wrong head count",
                    source="adversarial test plugin")]
