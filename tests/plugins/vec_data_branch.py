"""Test plugin for trial groups (``run --vectorise-seeds on``): a data-dependent Python branch.

The LayerNorm guards its input with ``if bool(torch.isnan(x).any()): raise``: a Python ``if`` on a
tensor's value, which ``vmap`` cannot trace per seed.

The function is nn.LayerNorm's (biased variance, eps = 1e-5; canonical ``weight``, ``bias`` (D,)), so
``check`` passes it and its sequential trials are ordinary; only vectorising its seeds with
``torch.func.vmap`` fails. Expected: a vectorised run falls back to sequential trials with one line
naming the reason (``EXPECT_FALLBACK`` is a fragment of it), with the same rows as ``--vectorise-seeds off``.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from harness import Component, Variant, hookimpl

NAME = "vec_data_branch"
EXPECT_CHECK = "pass"
EXPECT_REASON = ""
EXPECT_FALLBACK = "does not run under torch.func.vmap"


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


class GuardedLayerNorm(_LayerNorm):
    def forward(self, x):
        if bool(torch.isnan(x).any()):  # data-dependent control flow
            raise ValueError("NaN reached the LayerNorm")
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, 1e-5)


@hookimpl
def harness_add_components():
    return [Component(NAME, "layer_norm", lambda ctx: GuardedLayerNorm(ctx.cfg.d_model), "nn.LayerNorm with a Python NaN guard",
                      "trial-group fallback test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"layer_norm": NAME}, summary="baseline with a LayerNorm that branches on its input's values",
                    source="trial-group fallback test plugin")]
