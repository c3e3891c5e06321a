"""Correct plugin: the ReZero residual, a ``norm`` component with no LayerNorm.

Bachlechner et al. 2021, "ReZero is All You Need: Fast Convergence at Large Depth" (UAI 2021,
arXiv:2003.04887): every sub-layer is wrapped as ``x + alpha * sublayer(x)`` with ``alpha`` one
learnable scalar per residual, initialised to 0, so every layer starts as the identity; there is no
LayerNorm anywhere, the final one after each stack included (``final_norm = False``). Dropout is
applied to the sub-layer's output, as in the paper's ReZero Transformer.

The block owns exactly one parameter, ``alpha`` (shape ``()``); it makes no LayerNorm, so the
``params`` column counts none. It registers with ``has_layer_norm=False`` (held to the residual
contract ``x + a * sublayer(x)`` instead of post-norm / pre-norm) and ``differs=`` (it computes
neither). At initialisation the sub-layer gets a zero gradient (alpha = 0) and only alpha gets one;
the contract checks exactly that, and checks the rest holding a random alpha.

Expected: ``python -m harness --plugin tests/plugins/rezero.py check --variants baseline rezero``
exits 0, ``harness.testing.check_variant_contract(reg, "rezero")`` passes, and
``python -m harness --plugin tests/plugins/rezero.py run --variants rezero --preset tiny -q`` exits 0.
"""
from __future__ import annotations

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "rezero"
EXPECT_CHECK = "pass"
EXPECT_REASON = ""
DIFFERS = "ReZero: x + alpha * sublayer(x), alpha a learnable scalar from 0, no LayerNorm (Bachlechner et al. 2021)"


class ReZeroResidual(nn.Module):
    """``x + alpha * dropout(sublayer(x))``, ``alpha`` a learnable scalar initialised to 0.

    Shape: x (B, L, D) -> (B, L, D). Canonical parameter: ``alpha`` (shape ``()``).
    """

    final_norm = False  # no LayerNorm after the stacks either (the paper has none)

    def __init__(self, ctx):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(()))
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def forward(self, x, sublayer):
        return x + self.alpha * self.dropout(sublayer(x))


@hookimpl
def harness_add_components():
    return [Component(NAME, "norm", ReZeroResidual, "x + alpha * dropout(sublayer(x)), alpha from 0, no LayerNorm",
                      "Bachlechner et al. 2021 (test plugin)", differs=DIFFERS, has_layer_norm=False)]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"norm": NAME}, summary="baseline with ReZero residuals (no LayerNorm)",
                    source="Bachlechner et al. 2021 (test plugin)")]
