"""Adversarial plugin: a LayerNorm that normalises over the sequence and the features together.

Fault: mean and variance are taken over the last *two* dimensions (L, D) of a (B, L, D) input --
note 003's ``nn.LayerNorm([100, 24])``, i.e. ``normalized_shape`` = (seq, d_model) -- instead of
over D alone; the gain and bias are per feature (D,), so the canonical layout is the slot's.
Every position's output depends on the statistics of every position of its row: future target
tokens change earlier decoder outputs, and padded source tokens change the memory. It is not
declared different from ``nn.LayerNorm``. On a 2-D input (N, D) it *is* ``nn.LayerNorm`` (the
statistics are then over D), so a component test on a flat batch of vectors passes; only a
(B, L, D) input shows the fault. Not declared buggy.

Expected: ``check`` fails: the layer_norm component differs from nn.LayerNorm(D) on the same
input, and the causal/padding probes leak ("decoder position p changed ...").
"""
from __future__ import annotations

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_layernorm_wrong_axis"
EXPECT_CHECK = "fail"
EXPECT_REASON = "LayerNorm over (L, D) instead of D: differs from nn.LayerNorm, mixes positions (causal leak)"


class SequenceLayerNorm(nn.Module):
    """(x - mean_{L,D}) / sqrt(var_{L,D} + eps) * weight + bias (the fault: statistics over L too).

    Shape: (B, L, D) -> (B, L, D). Canonical: ``weight`` (D,), ``bias`` (D,).
    """

    def __init__(self, d_model: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))
        self.eps = eps

    def forward(self, x):
        dims = (-2, -1) if x.dim() >= 3 else (-1,)  # FAULT: should always be (-1,)
        mean = x.mean(dim=dims, keepdim=True)
        var = x.var(dim=dims, unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


@hookimpl
def harness_add_components():
    return [Component(NAME, "layer_norm", lambda ctx: SequenceLayerNorm(ctx.cfg.d_model),
                      "LayerNorm, statistics over the last two dimensions", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"layer_norm": NAME}, summary="baseline with LayerNorm over (L, D)",
                    source="adversarial test plugin")]
