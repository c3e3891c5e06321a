"""Test plugin for trial groups (``run --vectorize-seeds on``): a seed-dependent plain tensor attribute.

The LayerNorm scales its gain by a fixed random jitter (1 + 0.1 N(0, 1) per feature, drawn when the
model is built, so it differs between seeds) that it keeps as a plain tensor attribute instead of a
buffer. Each sequential trial uses its own jitter. A vectorised group calls one copy of the module
for every seed with the stacked parameters and buffers (``functional_call``), and a plain attribute
is neither: every seed would use seed 0's jitter. Nothing raises; only the first step's per-seed
losses, compared with each seed's own forward, show it.

It declares its difference from nn.LayerNorm (``differs=``), so ``check`` passes it; its sequential
trials are ordinary. Expected: a vectorised run falls back to sequential trials with one line naming
the reason (``EXPECT_FALLBACK`` is a fragment of it), with the same rows as ``--vectorize-seeds off``.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from harness import Component, Variant, hookimpl

NAME = "vec_plain_tensor"
EXPECT_CHECK = "pass"
EXPECT_REASON = ""
EXPECT_FALLBACK = "do not batch correctly"


class _LayerNorm(nn.Module):
    """nn.LayerNorm's parameters and canonical layout. Shape (..., D) -> (..., D)."""

    def __init__(self, d_model: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.bias = nn.Parameter(torch.zeros(d_model))

    def canonical_state(self):
        return {"weight": self.weight, "bias": self.bias}

    def load_canonical_state(self, state):
        with torch.no_grad():
            self.weight.copy_(state["weight"])
            self.bias.copy_(state["bias"])
        return []


class JitterLayerNorm(_LayerNorm):
    def __init__(self, d_model: int):
        super().__init__(d_model)
        self.jitter = 1.0 + 0.1 * torch.randn(d_model)  # (D,) a plain attribute: not a buffer

    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:], self.weight * self.jitter.to(x.device), self.bias, 1e-5)


@hookimpl
def harness_add_components():
    return [Component(NAME, "layer_norm", lambda ctx: JitterLayerNorm(ctx.cfg.d_model),
                      "nn.LayerNorm with a fixed random gain jitter per seed", "trial-group fallback test plugin",
                      differs="the gain is multiplied by a fixed random jitter 1 + 0.1 N(0, 1) per feature")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"layer_norm": NAME}, summary="baseline with a jittered LayerNorm gain kept in a plain "
                    "attribute", source="trial-group fallback test plugin")]
