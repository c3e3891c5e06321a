"""Adversarial plugin: RMSNorm with eps added outside the square root.

Fault: x / (sqrt(mean(x^2)) + eps) * weight instead of x / sqrt(mean(x^2) + eps) * weight. The same to
1e-6 on activations of unit scale; far from it where mean(x^2) is near eps (small activations).
Declared as RMSNorm (``reference="rms_norm"``).

Expected: ``check`` fails naming the fault ("eps added outside the square root").
"""
from __future__ import annotations

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_rmsnorm_eps_outside"
EXPECT_CHECK = "fail"
EXPECT_REASON = "eps added outside the square root"
DIFFERS = "RMSNorm: no mean subtraction, no bias (Zhang & Sennrich 2019)"


class RMSNorm(nn.Module):
    """x / (sqrt(mean(x^2)) + eps) * weight (the fault). Shape: (..., D) -> (..., D)."""

    def __init__(self, d_model: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.eps = eps

    def forward(self, x):
        return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + self.eps) * self.weight  # FAULT: eps outside the sqrt

    def canonical_state(self):
        return {"weight": self.weight, "bias": torch.zeros_like(self.weight)}

    def load_canonical_state(self, state):
        with torch.no_grad():
            self.weight.copy_(state["weight"])
        bias = state.get("bias")
        return ["bias is non-zero but RMSNorm has none"] if bias is not None and bool(bias.abs().max() > 0) else []


def _component() -> Component:
    args = (NAME, "layer_norm", lambda ctx: RMSNorm(ctx.cfg.d_model), "RMSNorm: x / rms(x) * weight, no bias",
            "Zhang & Sennrich 2019 (adversarial test plugin)")
    try:
        return Component(*args, differs=DIFFERS, reference="rms_norm")
    except TypeError:  # a harness without the declaration API
        return Component(*args)


@hookimpl
def harness_add_components():
    return [_component()]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"layer_norm": NAME}, summary="baseline with RMSNorm instead of LayerNorm",
                    source="Zhang & Sennrich 2019 (adversarial test plugin)")]
