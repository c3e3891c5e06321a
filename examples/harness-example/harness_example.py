"""Example transformer-harness plugin: RMSNorm (Zhang & Sennrich 2019) as a ``layer_norm`` component.

Load it either way:

* ``python -m harness --plugin examples/harness-example/harness_example.py list``
* ``pip install -e examples/harness-example`` (entry point group ``harness``), then plain
  ``python -m harness list``.
"""
from __future__ import annotations

import torch
from torch import nn

from harness import BuildContext, Component, Variant, hookimpl


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight; no mean subtraction, no bias.

    Shape: (..., D) -> (..., D). Canonical parameters: ``weight`` (D,) and ``bias`` (D,)
    (the bias is reported as zero and cannot be loaded if non-zero).
    """

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


def make_rms_norm(ctx: BuildContext) -> RMSNorm:
    """The factory: ``ctx`` (docs/plugins.md) gives the config; D = ``ctx.cfg.d_model``."""
    return RMSNorm(ctx.cfg.d_model)


@hookimpl
def harness_add_components():
    return [Component("rms", "layer_norm", make_rms_norm,
                      "RMSNorm: x / rms(x) * weight, no bias", "Zhang & Sennrich 2019 (example plugin)",
                      differs="RMSNorm: no mean subtraction and no bias (Zhang & Sennrich 2019); the slot's "
                              "reference is nn.LayerNorm")]


@hookimpl
def harness_add_variants():
    return [Variant("example_rmsnorm", {"norm": "pre", "layer_norm": "rms"},
                    summary="pre-norm with RMSNorm instead of LayerNorm (example plugin)",
                    source="Zhang & Sennrich 2019")]
