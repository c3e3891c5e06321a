"""Adversarial plugin: a LayerNorm that is nn.LayerNorm in evaluation and a BatchNorm in training.

Fault: in training mode the statistics of each feature are taken over every row and position of
the batch (BatchNorm's, Ioffe & Szegedy 2015) instead of over d_model per row; in evaluation it is
``nn.LayerNorm`` exactly. It is not declared different from ``nn.LayerNorm``. A component check
that runs the module in eval mode only (as a LayerNorm has no dropout, its training output should
be the same) sees ``nn.LayerNorm``; the model it trains mixes the batch's positions: future target
tokens and padded source tokens reach every output. Not declared buggy.

Expected: ``check`` fails: the layer_norm component behaves differently in training (its training
output is not nn.LayerNorm's; the diagnosis names the batch statistics), and the train-mode
causal/padding probes leak.
"""
from __future__ import annotations

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_layernorm_batch_stats_in_training"
EXPECT_CHECK = "fail"
EXPECT_REASON = "BatchNorm statistics in training, nn.LayerNorm in evaluation: differs in training, leaks"


class TwoModeNorm(nn.LayerNorm):
    """Evaluation: ``nn.LayerNorm`` over D. Training (the fault): each feature over all B * L rows.

    Shape: (..., D) -> (..., D). Canonical: ``weight`` (D,), ``bias`` (D,).
    """

    def forward(self, x):
        if not self.training:
            return super().forward(x)
        rows = x.reshape(-1, x.size(-1))  # FAULT: batch statistics in training
        mean, var = rows.mean(0), rows.var(0, unbiased=False)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


@hookimpl
def harness_add_components():
    return [Component(NAME, "layer_norm", lambda ctx: TwoModeNorm(ctx.cfg.d_model),
                      "LayerNorm (batch statistics in training)", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"layer_norm": NAME}, summary="baseline with a LayerNorm that uses batch statistics in "
                    "training", source="adversarial test plugin")]
