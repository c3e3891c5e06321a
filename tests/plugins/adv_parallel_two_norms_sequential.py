"""Adversarial plugin: a "parallel block" that chains its sub-layers (sequential pre-norm) instead.

Fault: declared as the parallel block (``parallel = True``, ``reference="parallel_block"``; GPT-J, PaLM
§2: y = x + Attention(LN(x)) + MLP(LN(x))), but ``forward`` feeds each sub-layer LayerNorm of the
previous one's residual output -- x1 = x + Attention(LN(x)), y = x1 + MLP(LN(x1)) -- the pre-norm
block written as a loop over the sub-layers it was handed. It trains, never crashes and leaks
nothing: only the formula tells it from a parallel block. Not declared buggy.

Expected: ``check`` fails naming the fault ("sequential pre-norm").
"""
from __future__ import annotations

from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_parallel_two_norms_sequential"
EXPECT_CHECK = "fail"
EXPECT_REASON = "sequential pre-norm"


class ChainedParallel(nn.Module):
    """(B, L, D) -> (B, L, D): for f in sublayers: x = x + dropout(f(norm(x))) (the fault: chained, not summed)."""

    final_norm = True
    parallel = True

    def __init__(self, ctx):
        super().__init__()
        self.norm = ctx.layer_norm()
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def forward(self, x, sublayers):
        for sublayer in sublayers:  # FAULT: each sub-layer should read norm(x) of the block's input
            x = x + self.dropout(sublayer(self.norm(x)))
        return x


@hookimpl
def harness_add_components():
    return [Component(NAME, "norm", ChainedParallel, "parallel block (attention and FFN from one LayerNorm)",
                      "PaLM §2 (adversarial test plugin)", differs="parallel block instead of post-norm",
                      reference="parallel_block")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"norm": NAME}, summary="baseline with a from-scratch parallel block",
                    source="adversarial test plugin")]
