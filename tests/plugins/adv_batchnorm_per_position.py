"""Adversarial plugin: a BatchNorm declared as BatchNorm that takes its statistics per position.

Fault: declared ``differs=`` with ``reference="batch_norm"`` (each feature normalised over the
batch's B * L rows in training), it takes each feature's mean and variance over the batch at each
position separately: what ``nn.BatchNorm1d`` computes on a (B, D, L) input where the code meant to
flatten the tokens, or a hand-written ``x.mean(0)`` on (B, L, D). Its evaluation output uses running
statistics (per feature) as BatchNorm's does, so only a training forward shows the fault. Per
position, future target tokens no longer reach earlier positions, but padded source tokens still
reach the real ones at the same positions. Not declared buggy.

Expected: ``check`` fails: the component is held to its declared formula in training and differs
("statistics per position"); the train-mode padding probe leaks.
"""
from __future__ import annotations

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_batchnorm_per_position"
EXPECT_CHECK = "fail"
EXPECT_REASON = "declared BatchNorm, statistics per position (over the batch only): differs from its formula"


class PerPositionBatchNorm(nn.BatchNorm1d):
    """Training: (x - mean_b) / sqrt(var_b + eps) * weight + bias, mean and biased variance over the
    batch axis only (the fault); running statistics as ``nn.BatchNorm1d``'s, used in evaluation.

    Shape: (B, L, D) -> (B, L, D). Canonical: ``weight``, ``bias`` (D,).
    """

    def forward(self, x):
        if not self.training:
            return super().forward(x.reshape(-1, x.size(-1))).view(x.shape)
        mean, var = x.mean(0), x.var(0, unbiased=False)  # FAULT: (L, D) statistics, one set per position
        with torch.no_grad():
            rows = x.reshape(-1, x.size(-1))
            self.running_mean.mul_(0.9).add_(0.1 * rows.mean(0))
            self.running_var.mul_(0.9).add_(0.1 * rows.var(0, unbiased=True))
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


@hookimpl
def harness_add_components():
    return [Component(NAME, "layer_norm", lambda ctx: PerPositionBatchNorm(ctx.cfg.d_model),
                      "BatchNorm with per-position statistics", "adversarial test plugin",
                      differs="BatchNorm (Ioffe & Szegedy 2015) in the LayerNorm's place", reference="batch_norm")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"layer_norm": NAME}, summary="baseline with a per-position BatchNorm",
                    source="adversarial test plugin")]
