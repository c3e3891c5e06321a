"""Correct plugin: RMSNorm as a ``layer_norm`` component that *declares* its difference.

y = x / sqrt(mean(x^2) + eps) * weight over the last dimension D (Zhang & Sennrich 2019): no mean
subtraction, no bias. It is not ``nn.LayerNorm`` and says so with
``differs="RMSNorm: no mean subtraction, no bias (Zhang & Sennrich 2019)"``, so the checks report the
size of the difference instead of failing. Canonical parameters: ``weight`` (D,) and ``bias`` (D,)
(the bias is exported as zeros and noted as lossy when a non-zero one is loaded), as in
``examples/harness-example``.

The ``differs=`` keyword is the declaration API being built; on a harness whose ``Component`` does
not accept it yet the plugin registers without it (``TypeError`` fallback), and the checks of that
harness may then (wrongly, from this plugin's point of view) hold it to nn.LayerNorm.

Expected: ``check --variants good_rmsnorm`` exits 0 with no flags (with the declaration API).
"""
from __future__ import annotations

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "good_rmsnorm"
TWIN = "rmsnorm"
EXPECT_CHECK = "pass"
EXPECT_REASON = ""
DIFFERS = "RMSNorm: no mean subtraction, no bias (Zhang & Sennrich 2019)"


class RMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * weight. Shape: (..., D) -> (..., D)."""

    def __init__(self, d_model: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    def canonical_state(self):
        return {"weight": self.weight, "bias": torch.zeros_like(self.weight)}

    def load_canonical_state(self, state):
        with torch.no_grad():
            self.weight.copy_(state["weight"])
        bias = state.get("bias")
        return ["bias is non-zero but RMSNorm has none"] if bias is not None and bool(bias.abs().max() > 0) else []


def _component() -> Component:
    args = (NAME, "layer_norm", lambda ctx: RMSNorm(ctx.cfg.d_model), "RMSNorm: x / rms(x) * weight, no bias",
            "Zhang & Sennrich 2019 (test plugin)")
    try:
        return Component(*args, differs=DIFFERS)
    except TypeError:  # a harness without the declaration API
        return Component(*args)


@hookimpl
def harness_add_components():
    return [_component()]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"layer_norm": NAME}, summary="baseline with RMSNorm instead of LayerNorm",
                    source="Zhang & Sennrich 2019 (test plugin)")]
