"""Adversarial plugin: ALiBi with one slope 1/H for every head.

Fault: every head gets m = 1/H instead of the paper's geometric 2^(-8/H), 2^(-16/H), ...: a penalty on
distance all the same, causal, no crash; declared as the paper's formula (``reference="linear_biases"``).

Expected: ``check`` fails naming the fault ("one slope 1/H for every head").
"""
from __future__ import annotations

import math

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_alibi_slopes_over_h"
EXPECT_CHECK = "fail"
EXPECT_REASON = "one slope 1/H for every head"


class ALiBi(nn.Module):
    """x * sqrt(D) on the embeddings (B, L, D); ``score_bias`` (H, Tq, Tk)."""

    def __init__(self, ctx):
        super().__init__()
        self.h = ctx.cfg.h
        self.scale = math.sqrt(ctx.cfg.d_model)
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def forward(self, x):
        return self.dropout(x * self.scale)

    def score_bias(self, tq, tk, device, dtype):
        i = torch.arange(tq, device=device, dtype=torch.float64)[:, None]
        j = torch.arange(tk, device=device, dtype=torch.float64)[None, :]
        m = torch.full((self.h, 1, 1), 1.0 / self.h, dtype=torch.float64, device=device)  # FAULT: one slope 1/H
        return (-m * (i - j).abs()).to(dtype)


@hookimpl
def harness_add_components():
    return [Component(NAME, "positional", ALiBi, "ALiBi, slope 1/H", "Press et al. 2022 (adversarial test plugin)",
                      differs="linear score biases instead of additive PE", reference="linear_biases")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"positional": NAME}, summary="baseline with a from-scratch ALiBi", source="adversarial test plugin")]
