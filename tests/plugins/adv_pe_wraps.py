"""Adversarial plugin: a sinusoidal positional encoding that wraps after 16 positions.

Fault: the table is indexed with ``position % 16`` (say, a cache sized for the sequences the author tried),
so positions 16, 17, ... get the vectors of 0, 1, .... Every length the checks used to feed (5 and 11) is
shorter, so it passed as the paper's ``x * sqrt(d_model) + PE[:L]``; the g2p task's words (up to 24 tokens)
and the gpu preset's 32-token rows would train another function than the class "same function" says.
Deliberate check-gaming; not declared buggy.

Expected: ``check`` (and the run gate, at the trial's max_len) fails the component and says where it goes
wrong: "right up to position 15, wrong from position 16 on".
"""
from __future__ import annotations

import torch

from harness import Component, Variant, hookimpl
from variants.positional import ScaledPositional  # the paper's component; only the indexing is changed

NAME = "adv_pe_wraps"
EXPECT_CHECK = "fail"
EXPECT_REASON = "PE[pos % 16]: positions from 16 on get the vectors of 0, 1, ..."


class WrappingPositional(ScaledPositional):
    """dropout(x * sqrt(D) + PE[pos % 16]) (the fault: should be PE[pos]). Shape (B, L, D) -> (B, L, D)."""

    def forward(self, x):
        pos = torch.arange(x.size(1), device=x.device) % 16  # FAULT
        return self.dropout(x * self.scale + self.pe[pos])


@hookimpl
def harness_add_components():
    return [Component(NAME, "positional", WrappingPositional, "x*sqrt(d_model) + sinusoidal PE, dropout",
                      "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"positional": NAME}, summary="baseline (positions wrap after 16)",
                    source="adversarial test plugin")]
