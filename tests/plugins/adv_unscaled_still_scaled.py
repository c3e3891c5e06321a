"""Adversarial plugin: a "no sqrt(d_model) scale" positional component that still scales.

Fault: the author copied the paper's embedding (x * sqrt(d_model) + PE[:L]) to make the ablation the
study notes ask for ("why multiply by sqrt(d_model)?"), declared it held to the formula
``unscaled_pe`` (x + PE[:L]), and forgot to take the scale out. Trained against the
baseline it would be the baseline again, and a study of the scale would find "no effect" whatever
the truth. Its declared difference is the built-in ``unscaled``'s, word for word.

Expected: ``check`` fails the component against its formula and names the fault: "embeddings scaled
by sqrt(d_model) although the formula has no scale".
"""
from __future__ import annotations

import math

from torch import nn

from harness import Component, Variant, hookimpl
from variants.positional import sinusoidal_table  # the table is right; the scale is the fault

NAME = "adv_unscaled_still_scaled"
EXPECT_CHECK = "fail"
EXPECT_REASON = "declared x + PE[:L] (formula unscaled_pe) but computes x * sqrt(d_model) + PE[:L]"


class StillScaledPositional(nn.Module):
    """dropout(x * sqrt(D) + PE[:L]) (the fault: should be x + PE[:L]). Shape (B, L, D) -> (B, L, D)."""

    def __init__(self, ctx):
        super().__init__()
        self.scale = math.sqrt(ctx.cfg.d_model)  # FAULT: left in from the paper's component
        self.register_buffer("pe", sinusoidal_table(ctx.cfg.max_len, ctx.cfg.d_model), persistent=False)
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def forward(self, x):
        return self.dropout(x * self.scale + self.pe[: x.size(1)])


@hookimpl
def harness_add_components():
    return [Component(NAME, "positional", StillScaledPositional, "x + sinusoidal PE, dropout (no sqrt(d_model))",
                      "adversarial test plugin",
                      differs="no sqrt(d_model) scaling of the embeddings (the paper's embedding otherwise)",
                      reference="unscaled_pe")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"positional": NAME}, summary="baseline without the sqrt(d_model) scale (it says)",
                    source="adversarial test plugin")]
