"""Adversarial plugin: a LayerNorm whose statistics, from position 16 on, run over a window of positions.

Fault: positions 0-15 are normalised over d_model alone, as ``nn.LayerNorm(d_model)``; from position 16 on
the mean and variance are taken over that position and the one before it (a "smoothed" normaliser that looks
only backwards, so no causal probe sees a leak). The layer-norm contract fed 7 positions, so the component
passed as ``nn.LayerNorm`` and its variant was classed the same function as the baseline, while the g2p
task's words (up to 24 tokens) and the gpu preset's 32-token rows train another function. Deliberate
check-gaming; not declared buggy.

Expected: ``check`` fails the component at the config's ``max_len`` and says where it goes wrong: "right up
to position 15, wrong from position 16 on".
"""
from __future__ import annotations

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_layernorm_mixes_after_16"
EXPECT_CHECK = "fail"
EXPECT_REASON = "statistics over positions t - 1 and t from position 16 on"


class WindowLayerNorm(nn.LayerNorm):
    """LayerNorm(d_model), except statistics over positions (t - 1, t) for t >= 16 (the fault). Shape (B, L, D)."""

    def __init__(self, ctx):
        super().__init__(ctx.cfg.d_model, eps=1e-5)

    def forward(self, x):
        out = super().forward(x)
        if x.dim() == 3 and x.size(1) > 16:  # FAULT
            pair = torch.stack([x[:, 15:-1], x[:, 16:]], dim=2)  # (B, L - 16, 2, D)
            mu = pair.mean(dim=(2, 3), keepdim=True)
            var = pair.var(dim=(2, 3), unbiased=False, keepdim=True)
            tail = ((pair - mu) / torch.sqrt(var + self.eps))[:, :, 1] * self.weight + self.bias
            out = torch.cat([out[:, :16], tail], dim=1)
        return out


@hookimpl
def harness_add_components():
    return [Component(NAME, "layer_norm", WindowLayerNorm, "LayerNorm(d_model), eps 1e-5",
                      "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"layer_norm": NAME}, summary="baseline (LayerNorm mixes positions after 16)",
                    source="adversarial test plugin")]
