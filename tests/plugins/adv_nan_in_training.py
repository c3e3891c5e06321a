"""Adversarial plugin: a ReLU FFN whose output is NaN in training mode only.

Fault: in training mode the FFN output is multiplied by a NaN (a dropout written as x * keep / (1 - p) with
p = 1 - 0/0, say); in evaluation mode it is the paper's FFN. Every parameter used; the evaluation-mode
contracts hold.

Expected: ``check`` fails naming the fault first as a non-finite output in training mode.
"""
from __future__ import annotations

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_nan_in_training"
EXPECT_CHECK = "fail"
EXPECT_REASON = "non-finite output in training mode"


class NaNInTraining(nn.Module):
    """(B, L, D) -> (B, L, D): w_2(dropout(relu(w_1 x))), NaN everywhere in training mode."""

    def __init__(self, ctx):
        super().__init__()
        d = ctx.cfg.d_model
        self.w_1, self.w_2 = ctx.linear(d, ctx.cfg.d_ff), ctx.linear(ctx.cfg.d_ff, d)
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def forward(self, x):
        out = self.w_2(self.dropout(torch.relu(self.w_1(x))))
        return out * float("nan") if self.training else out  # FAULT: NaN in training mode


@hookimpl
def harness_add_components():
    return [Component(NAME, "feed_forward", NaNInTraining, "ReLU FFN, NaN in training", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"feed_forward": NAME}, summary="baseline with an FFN that is NaN in training",
                    source="adversarial test plugin")]
