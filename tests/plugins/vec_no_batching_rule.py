"""Test plugin for trial groups (``run --vectorise-seeds on``): an op without a batching rule.

The LayerNorm runs as a custom ``torch.autograd.Function`` (its backward recomputes the forward)
(``setup_context`` style, so ``torch.func`` accepts it) that defines neither ``vmap`` nor
``generate_vmap_rule``: ``vmap`` has no rule to batch it.

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

NAME = "vec_no_batching_rule"
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


class _LayerNormFn(torch.autograd.Function):
    @staticmethod
    def forward(x, weight, bias):
        return F.layer_norm(x, x.shape[-1:], weight, bias, 1e-5)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, grad):
        x, weight, bias = ctx.saved_tensors
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_() for t in (x, weight, bias)]
            y = F.layer_norm(leaves[0], x.shape[-1:], leaves[1], leaves[2], 1e-5)
            return torch.autograd.grad(y, leaves, grad)


class FunctionLayerNorm(_LayerNorm):
    def forward(self, x):
        return _LayerNormFn.apply(x, self.weight, self.bias)


@hookimpl
def harness_add_components():
    return [Component(NAME, "layer_norm", lambda ctx: FunctionLayerNorm(ctx.cfg.d_model), "nn.LayerNorm as an autograd.Function without a vmap rule",
                      "trial-group fallback test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"layer_norm": NAME}, summary="baseline with a LayerNorm that is an autograd.Function without a vmap rule",
                    source="trial-group fallback test plugin")]
