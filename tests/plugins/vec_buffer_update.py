"""Test plugin for trial groups (``run --vectorise-seeds on``): a buffer updated in place by the forward.

The LayerNorm counts its training-mode calls in a buffer (``self.calls.add_(1)``), as running
statistics do. Stacked per seed the update runs, but it mutates the group's buffers behind the
functional step, so the group is not the same program as its trials.

The function is nn.LayerNorm's (biased variance, eps = 1e-5; canonical ``weight``, ``bias`` (D,)), so
``check`` passes it and its sequential trials are ordinary; only vectorising its seeds with
``torch.func.vmap`` changes a buffer behind the functional step. Expected: a vectorised run falls back to sequential trials with one line
naming the reason (``EXPECT_FALLBACK`` is a fragment of it), with the same rows as ``--vectorise-seeds off``.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from harness import Component, Variant, hookimpl

NAME = "vec_buffer_update"
EXPECT_CHECK = "pass"
EXPECT_REASON = ""
EXPECT_FALLBACK = "updates its buffer"


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


class CountingLayerNorm(_LayerNorm):
    def __init__(self, d_model: int):
        super().__init__(d_model)
        self.register_buffer("calls", torch.zeros((), dtype=torch.long), persistent=False)

    def forward(self, x):
        if self.training:
            self.calls.add_(1)  # in-place buffer update (running statistics do the same)
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, 1e-5)


@hookimpl
def harness_add_components():
    return [Component(NAME, "layer_norm", lambda ctx: CountingLayerNorm(ctx.cfg.d_model), "nn.LayerNorm that counts its calls in a buffer",
                      "trial-group fallback test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"layer_norm": NAME}, summary="baseline with a LayerNorm that updates a buffer in its forward",
                    source="trial-group fallback test plugin")]
