"""Slot ``feed_forward``: the position-wise feed-forward network of every layer.

* ``relu``: FFN(x) = w_2(dropout(relu(w_1(x)))) -- Vaswani et al. 2017 §3.3, the Annotated
  Transformer's ``PositionwiseFeedForward`` (inner width d_ff). The slot's default.
* ``gelu``: the same with GELU (the exact, erf form) -- Hendrycks & Gimpel 2016; BERT, GPT-2.
* ``swiglu``: w_down(dropout(silu(w_gate(x)) * w_up(x))) -- Shazeer 2020, "GLU Variants Improve
  Transformer", FFN_SwiGLU(x, W, V, W_2) = (Swish_1(xW) ⊗ xV) W_2, with W = w_gate, V = w_up,
  W_2 = w_down (LLaMA-HF's ``gate_proj``, ``up_proj``, ``down_proj``; Meta's ``w1``, ``w3``, ``w2``).
* ``geglu``: w_down(dropout(gelu(w_gate(x)) * w_up(x))) -- Shazeer 2020, FFN_GEGLU.

d_ff convention of the gated ones: Shazeer's, an inner width of ``int(2 * d_ff / 3)`` (rounded
down), so that three matrices hold about as many parameters as the ReLU FFN's two at the same
``model.d_ff`` (Shazeer 2020 §2: "we reduce the number of hidden units ... by a factor of 2/3";
T5-base 3072 -> 2048). At d_ff = 256 the inner width is 170.

Canonical parameters: ``w_1`` (d_ff, D), ``w_2`` (D, d_ff); gated: ``w_gate``, ``w_up`` (inner, D) and
``w_down`` (D, inner) -- names of their own, as their inner width differs -- each ``.weight`` and,
when the ``projections`` slot gives biases, ``.bias``. Shape of ``forward``: (B, L, D) -> (B, L, D).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from harness import Component, hookimpl


def gated_width(d_ff: int) -> int:
    """Inner width of a gated FFN: Shazeer 2020's 2/3 of d_ff, rounded down (at least 1)."""
    return max(1, int(2 * d_ff / 3))


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = w_2(dropout(act(w_1(x)))) (Vaswani et al. 2017 §3.3; Annotated Transformer).

    Shape: (B, L, D) -> (B, L, D), inner width d_ff.
    """

    def __init__(self, ctx, activation=torch.relu):
        super().__init__()
        self.w_1 = ctx.linear(ctx.cfg.d_model, ctx.cfg.d_ff)
        self.w_2 = ctx.linear(ctx.cfg.d_ff, ctx.cfg.d_model)
        self.dropout = nn.Dropout(ctx.cfg.dropout)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(self.dropout(self.activation(self.w_1(x))))


class GatedFeedForward(nn.Module):
    """FFN_GLU(x) = w_down(dropout(act(w_gate(x)) * w_up(x))) (Shazeer 2020).

    Shape: (B, L, D) -> (B, L, D), inner width ``gated_width(d_ff)``.
    """

    def __init__(self, ctx, activation):
        super().__init__()
        d, inner = ctx.cfg.d_model, gated_width(ctx.cfg.d_ff)
        self.w_gate = ctx.linear(d, inner)
        self.w_up = ctx.linear(d, inner)
        self.w_down = ctx.linear(inner, d)
        self.dropout = nn.Dropout(ctx.cfg.dropout)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(self.dropout(self.activation(self.w_gate(x)) * self.w_up(x)))


_GATED = "inner width int(2 * d_ff / 3) (Shazeer's parameter-matched convention)"


@hookimpl
def harness_add_components():
    return [
        Component("relu", "feed_forward", PositionwiseFeedForward, "w_2(relu(w_1 x)), inner width d_ff",
                  "Vaswani et al. 2017 §3.3; Annotated PositionwiseFeedForward", default=True),
        Component("gelu", "feed_forward", lambda ctx: PositionwiseFeedForward(ctx, F.gelu),
                  "w_2(gelu(w_1 x)) (exact erf GELU), inner width d_ff", "Hendrycks & Gimpel 2016; BERT, GPT-2",
                  differs="GELU (erf form) instead of ReLU (Hendrycks & Gimpel 2016; BERT, GPT-2)", reference="ffn_gelu"),
        Component("swiglu", "feed_forward", lambda ctx: GatedFeedForward(ctx, F.silu),
                  f"w_down(silu(w_gate x) * w_up x), {_GATED}", "Shazeer 2020 (FFN_SwiGLU); LLaMA",
                  differs=f"gated: (Swish(x W) * x V) W_2 with three matrices, {_GATED} (Shazeer 2020)",
                  reference="ffn_swiglu"),
        Component("geglu", "feed_forward", lambda ctx: GatedFeedForward(ctx, F.gelu),
                  f"w_down(gelu(w_gate x) * w_up x), {_GATED}", "Shazeer 2020 (FFN_GEGLU)",
                  differs=f"gated: (GELU(x W) * x V) W_2 with three matrices, {_GATED} (Shazeer 2020)",
                  reference="ffn_geglu"),
    ]
