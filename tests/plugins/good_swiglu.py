"""Correct plugin: SwiGLU written from scratch (Shazeer 2020 eq. 6, LLaMA's FeedForward) at 2/3 d_ff.

(Swish(x W) * x V) W_2 with W = w_gate, V = w_up, W_2 = w_down, inner width int(2 d_ff / 3), as the
built-in ``swiglu``. Declares its difference from the ReLU FFN and names ``reference="ffn_swiglu"``;
does not claim ``equivalent_to="swiglu"``.

Expected: ``check --variants good_swiglu swiglu_ffn`` exits 0 and the two share one class.
"""
from __future__ import annotations

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "good_swiglu"
TWIN = "swiglu_ffn"
EXPECT_CHECK = "pass"
EXPECT_REASON = ""


class SwiGLU(nn.Module):
    """(B, L, D) -> (B, L, D): w_down(dropout(x w_gate * sigmoid(x w_gate) * x w_up))."""

    def __init__(self, ctx):
        super().__init__()
        d, inner = ctx.cfg.d_model, int(2 * ctx.cfg.d_ff / 3)
        self.w_gate, self.w_up, self.w_down = ctx.linear(d, inner), ctx.linear(d, inner), ctx.linear(inner, d)
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def forward(self, x):
        g = self.w_gate(x)
        return self.w_down(self.dropout(g * torch.sigmoid(g) * self.w_up(x)))


@hookimpl
def harness_add_components():
    return [Component(NAME, "feed_forward", SwiGLU, "SwiGLU from scratch at 2/3 d_ff", "Shazeer 2020 (test plugin)",
                      differs="gated SwiGLU instead of the ReLU FFN", reference="ffn_swiglu")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"feed_forward": NAME}, summary="baseline with a from-scratch SwiGLU", source="test plugin")]
