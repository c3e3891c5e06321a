"""Adversarial plugin: a LayerNorm without epsilon (eps = 0).

Fault: ``(x - mean) / sqrt(var) * weight + bias`` with the biased variance over D -- exactly
``nn.LayerNorm`` except that eps is 0 instead of 1e-5. On ordinary activations (variance ~1) the
difference is ~eps / (2 var) relative, about 5e-6: below or near an fp32 tolerance, so a
comparison on random inputs can pass. On a low-variance row (variance ~eps) it differs by O(1),
and on a constant row (variance 0) it returns NaN (0 / 0) where ``nn.LayerNorm`` returns the
bias. Not declared different from nn.LayerNorm. Not declared buggy.

Expected: ``check`` fails with the layer_norm component differing from nn.LayerNorm on
low-variance or constant rows ("NaN on a constant row" / "differs from nn.LayerNorm by ...").
"""
from __future__ import annotations

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_layernorm_no_eps"
EXPECT_CHECK = "fail"
EXPECT_REASON = "LayerNorm with eps = 0: differs from nn.LayerNorm on low-variance rows, NaN on constant rows"


class NoEpsLayerNorm(nn.Module):
    """(x - mean) / sqrt(var) * weight + bias, biased variance over D, no eps (the fault).

    Shape: (..., D) -> (..., D). Canonical: ``weight`` (D,), ``bias`` (D,).
    """

    def __init__(self, d_model: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = x.var(-1, unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(var) * self.weight + self.bias  # FAULT: sqrt(var + 1e-5)


@hookimpl
def harness_add_components():
    return [Component(NAME, "layer_norm", lambda ctx: NoEpsLayerNorm(ctx.cfg.d_model),
                      "LayerNorm, biased variance, no eps", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"layer_norm": NAME}, summary="baseline with LayerNorm eps = 0",
                    source="adversarial test plugin")]
