"""Test plugin for trial groups (``run --vectorise-seeds on``): a seed-dependent plain tensor attribute.

The LayerNorm scales its gain by a fixed random jitter (0.5, 1 or 2 per feature, drawn when the
model is built, so it differs between seeds) that it keeps as a plain tensor attribute instead of a
buffer. Each sequential trial uses its own jitter. A vectorised group calls one copy of the module
for every seed with the stacked parameters and buffers (``functional_call``), and a plain attribute
is neither: every seed would use seed 0's jitter. Nothing raises; only the first step's per-seed
losses, compared with each seed's own forward, show it.

Its canonical ``weight`` is the gain (weight x jitter), but a tensor outside the state dict is state
the checks see too: ``check`` flags it (a fresh model loaded with this one's ``state_dict`` computes
differently) and so does every trial's contract check (``weight`` is not a view of the canonical
layout), so its trials are ``invalid`` vectorised or not: the fallback must keep that verdict.
Expected: a vectorised run falls back to sequential trials with one line naming the reason
(``EXPECT_FALLBACK`` is a fragment of it), with the same rows as ``--vectorise-seeds off``.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from harness import Component, Variant, hookimpl

NAME = "vec_plain_tensor"
EXPECT_CHECK = "fail"
EXPECT_REASON = "load_state_dict did not restore every canonical parameter"
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
    """Gain = weight * jitter; the canonical ``weight`` is that product, so in canonical terms it is
    nn.LayerNorm exactly (a fresh model with another jitter loads the same function)."""

    def __init__(self, d_model: int):
        super().__init__(d_model)
        # (D,) powers of two (exact to multiply and divide by); a plain attribute: not a buffer
        self.jitter = 2.0 ** torch.randint(-1, 2, (d_model,)).float()

    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:], self.weight * self.jitter.to(x.device), self.bias, 1e-5)

    def canonical_state(self):
        return {"weight": self.weight * self.jitter.to(self.weight.device), "bias": self.bias}

    def load_canonical_state(self, state):
        with torch.no_grad():
            self.weight.copy_(state["weight"] / self.jitter.to(self.weight.device))
            self.bias.copy_(state["bias"])
        return []


@hookimpl
def harness_add_components():
    return [Component(NAME, "layer_norm", lambda ctx: JitterLayerNorm(ctx.cfg.d_model),
                      "nn.LayerNorm whose gain is weight x a fixed random jitter", "trial-group fallback test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"layer_norm": NAME}, summary="baseline with a jittered LayerNorm gain kept in a plain "
                    "attribute", source="trial-group fallback test plugin")]
