"""Adversarial plugin: a pre-norm residual block that claims ``final_norm = False``.

Fault: ``forward`` computes ``x + dropout(sublayer(norm(x)))`` (pre-norm, Xiong et al. 2020; the
Annotated Transformer's ``SublayerConnection``), but the class attribute ``final_norm`` is
``False``, so the assembler builds no LayerNorm after the encoder and decoder stacks: the
decoder's output goes un-normalised into the generator (and the memory un-normalised into
cross-attention). It is neither the paper's post-norm nor a proper pre-norm
(``nn.Transformer(norm_first=True)`` always ends with a LayerNorm). No probe leaks. Not declared
buggy.

Expected: ``check`` fails with the norm component matching neither reference: e.g. "norm=
adv_prenorm_no_final computes pre-norm but declares final_norm=False" or "differs from
nn.Transformer(norm_first=True) (no final LayerNorm)".
"""
from __future__ import annotations

from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_prenorm_no_final"
EXPECT_CHECK = "fail"
EXPECT_REASON = "pre-norm block without the final LayerNorm (final_norm=False)"


class PreNormNoFinal(nn.Module):
    """``x + dropout(sublayer(norm(x)))`` with ``final_norm = False`` (the fault).

    Shape: x (B, L, D) -> (B, L, D).
    """

    final_norm = False  # FAULT: pre-norm needs the final LayerNorm (True)

    def __init__(self, ctx):
        super().__init__()
        self.norm = ctx.layer_norm()
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def forward(self, x, sublayer):
        return x + self.dropout(sublayer(self.norm(x)))


@hookimpl
def harness_add_components():
    return [Component(NAME, "norm", PreNormNoFinal, "x + dropout(sublayer(LayerNorm(x)))",
                      "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"norm": NAME}, summary="baseline with pre-norm blocks and no final LayerNorm",
                    source="adversarial test plugin")]
