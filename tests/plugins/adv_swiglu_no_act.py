"""Adversarial plugin: SwiGLU without the SiLU on the gate (a bilinear layer, Shazeer 2020's "Bilinear").

Fault: w_down(x w_gate * x w_up). Every parameter used, no crash, no leak; declared as SwiGLU
(``reference="ffn_swiglu"``).

Expected: ``check`` fails naming the fault ("no activation on the gate").
"""
from __future__ import annotations

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_swiglu_no_act"
EXPECT_CHECK = "fail"
EXPECT_REASON = "no activation on the gate"


class SwiGLU(nn.Module):
    """(B, L, D) -> (B, L, D): w_down(dropout(x w_gate * sigmoid(x w_gate) * x w_up))."""

    def __init__(self, ctx):
        super().__init__()
        d, inner = ctx.cfg.d_model, int(2 * ctx.cfg.d_ff / 3)
        self.w_gate, self.w_up, self.w_down = ctx.linear(d, inner), ctx.linear(d, inner), ctx.linear(inner, d)
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def forward(self, x):
        g = self.w_gate(x)
        return self.w_down(self.dropout(g * self.w_up(x)))  # FAULT: no SiLU


@hookimpl
def harness_add_components():
    return [Component(NAME, "feed_forward", SwiGLU, "SwiGLU without the gate activation", "Shazeer 2020 (adversarial test plugin)",
                      differs="gated SwiGLU instead of the ReLU FFN", reference="ffn_swiglu")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"feed_forward": NAME}, summary="baseline with a from-scratch SwiGLU", source="adversarial test plugin")]
