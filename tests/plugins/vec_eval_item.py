"""Test plugin for trial groups: a module that vectorises in training but not in evaluation.

The LayerNorm reads the largest |x| of its input with ``.item()`` only in eval mode (to pick eps,
which always ends at 1e-5): training's vmapped step runs, the group trains vectorised, and the
batched evaluation of its seeds (:mod:`harness.tasks.seeds`, ``vmap`` over the stacked
parameters in eval mode) raises. Expected: the group evaluates its seeds one after another with
one log line naming the reason (``EXPECT_EVAL_FALLBACK`` is a fragment of it), and every seed's
scores equal its own per-seed evaluation; training stays vectorised.

The function is nn.LayerNorm's (biased variance, eps = 1e-5; canonical ``weight``, ``bias`` (D,)),
so ``check`` passes it.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from harness import Component, Variant, hookimpl

NAME = "vec_eval_item"
EXPECT_CHECK = "pass"
EXPECT_REASON = ""
EXPECT_EVAL_FALLBACK = "evaluated one after another, not batched: the batched evaluation raised"


class EvalItemLayerNorm(nn.Module):
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

    def forward(self, x):
        eps = 1e-5 if self.training else max(1e-5, 0.0 * x.detach().abs().max().item())  # eval only: .item()
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, eps)


@hookimpl
def harness_add_components():
    return [Component(NAME, "layer_norm", lambda ctx: EvalItemLayerNorm(ctx.cfg.d_model),
                      "nn.LayerNorm that reads max|x| with .item() in eval mode", "trial-group fallback test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"layer_norm": NAME}, summary="baseline with a LayerNorm that calls .item() in eval mode",
                    source="trial-group fallback test plugin")]
