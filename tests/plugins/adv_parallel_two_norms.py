"""Adversarial plugin: a parallel block with a LayerNorm of its own for each sub-layer.

Fault: declared as the parallel block (``parallel = True``, ``reference="parallel_block"``; GPT-J, PaLM
§2: y = x + Attention(LN(x)) + MLP(LN(x)), one LayerNorm), but each sub-layer reads its own LayerNorm:
y = x + Attention(LN_1(x)) + MLP(LN_2(x)) (GPT-NeoX's parallel residual with two norms). Every parameter
used, no crash, no leak; with equal gains it is the parallel block, so only LayerNorms of different
gains tell it apart.

Expected: ``check`` fails naming the fault ("a LayerNorm for each sub-layer").
"""
from __future__ import annotations

from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_parallel_two_norms"
EXPECT_CHECK = "fail"
EXPECT_REASON = "a LayerNorm for each sub-layer"


class TwoNormParallel(nn.Module):
    """(B, L, D) -> (B, L, D): x + sum_i dropout(f_i(norm_i(x))), the attention from ``norm``, the others from
    ``norm_ffn`` (the fault: one LayerNorm per sub-layer)."""

    final_norm = True
    parallel = True

    def __init__(self, ctx):
        super().__init__()
        self.norm, self.norm_ffn = ctx.layer_norm(), ctx.layer_norm()
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def forward(self, x, sublayers):
        norms = [self.norm] + [self.norm_ffn] * (len(sublayers) - 1)  # FAULT: one LayerNorm each
        return x + sum(self.dropout(f(n(x))) for f, n in zip(sublayers, norms))


@hookimpl
def harness_add_components():
    return [Component(NAME, "norm", TwoNormParallel, "parallel block (attention and FFN from one LayerNorm)",
                      "PaLM §2 (adversarial test plugin)", differs="parallel block instead of post-norm",
                      reference="parallel_block")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"norm": NAME}, summary="baseline with a from-scratch parallel block",
                    source="adversarial test plugin")]
