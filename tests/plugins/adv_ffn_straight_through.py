"""Adversarial plugin: a feed-forward whose forward is the paper's and whose backward is 1.5x its derivative.

Fault: ``y + 0.5 * (y - y.detach())``, the straight-through trick: the value is the position-wise FFN's
(Vaswani et al. 2017 §3.3) to the last bit, the gradient through it 1.5x. Every output comparison passes;
only gradients show it. Since 320378a a gap in the gradients alone, with the outputs within their
threshold, is drawn again on a second reference state and batch before it counts (a ReLU input within
float32 rounding of 0 moves one gradient entry far beyond rounding on one draw: a false alarm at the g2p
and deep sizes); this plugin checks that the second draw keeps a real gradient fault a failure, and that
the failure says what kind of fault it is. Deliberate check-gaming; not declared buggy.

Expected: ``check`` fails against nn.Transformer: "the outputs agree but ...'s gradient differs on two
reference states and batches ...: the backward is not the derivative of the forward".
"""
from __future__ import annotations

import torch

from harness import Component, Variant, hookimpl
from variants.feed_forward import PositionwiseFeedForward  # the paper's FFN; only its backward is changed

NAME = "adv_ffn_straight_through"
EXPECT_CHECK = "fail"
EXPECT_REASON = "the FFN's value is the paper's, its gradient 1.5x: only the backward differs"


class StraightThroughFeedForward(PositionwiseFeedForward):
    """The paper's FFN with its gradient scaled by 1.5 (the fault). Shape: (B, L, D) -> (B, L, D)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        return y + 0.5 * (y - y.detach())  # FAULT: the same value, 1.5x the gradient


@hookimpl
def harness_add_components():
    return [Component(NAME, "feed_forward", StraightThroughFeedForward,
                      "position-wise FFN (gradient x 1.5)", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"feed_forward": NAME}, summary="baseline whose FFN backward is 1.5x its derivative",
                    source="adversarial test plugin")]
