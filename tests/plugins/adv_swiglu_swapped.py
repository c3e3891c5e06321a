"""Adversarial plugin: a SwiGLU feed-forward with the gate and up projections swapped.

Fault: ``w_down(silu(w_up(x)) * w_gate(x))`` where Shazeer 2020 (FFN_SwiGLU = (Swish(xW) ⊗ xV) W_2) and
the canonical layout say ``w_down(silu(w_gate(x)) * w_up(x))``. Relabel the two matrices and it is the
same function -- trained from scratch it learns exactly as well -- but under the canonical names it is
another one: a LLaMA checkpoint's ``gate_proj`` / ``up_proj`` loaded into it computes something else,
and every pair comparison holding one canonical state disagrees. The component declares SwiGLU
(``differs=... reference="ffn_swiglu"``). Not declared buggy.

Expected: ``check`` fails naming "gate and up projections swapped" (the report says it is the same
function only after relabelling w_gate <-> w_up, and to export the gated projection as w_gate).
"""
from __future__ import annotations

from torch import nn
from torch.nn import functional as F

from harness import Component, Variant, hookimpl

NAME = "adv_swiglu_swapped"
EXPECT_CHECK = "fail"
EXPECT_REASON = "SwiGLU with the gate and up projections exchanged"


class SwappedSwiGLU(nn.Module):
    """w_down(silu(w_up x) * w_gate x) (the fault), inner width 2/3 d_ff. Shape (B, L, D) -> (B, L, D)."""

    def __init__(self, ctx):
        super().__init__()
        d, inner = ctx.cfg.d_model, int(2 * ctx.cfg.d_ff / 3)
        self.w_gate, self.w_up, self.w_down = ctx.linear(d, inner), ctx.linear(d, inner), ctx.linear(inner, d)
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def forward(self, x):
        return self.w_down(self.dropout(F.silu(self.w_up(x)) * self.w_gate(x)))  # FAULT: silu on w_gate(x)


@hookimpl
def harness_add_components():
    return [Component(NAME, "feed_forward", SwappedSwiGLU, "SwiGLU, gate and up swapped", "adversarial test plugin",
                      differs="gated SwiGLU FFN (Shazeer 2020)", reference="ffn_swiglu")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"feed_forward": NAME}, summary="baseline with a SwiGLU whose gate and up are swapped",
                    source="adversarial test plugin")]
