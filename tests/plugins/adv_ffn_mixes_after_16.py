"""Adversarial plugin: a ReLU feed-forward network that stops being position-wise after 16 positions.

Fault: from position 16 on, each position's input is mixed with the previous position's (x_t + 0.5 x_{t-1}:
a "local context" trick that looks only backwards, so no causal probe sees a leak). The paper's FFN is
applied to each position separately and identically (Vaswani et al. 2017 §3.3). The feed-forward contract
fed 5 positions, so the component passed as ``w_2(relu(w_1 x))`` and its variant was classed the same
function as the baseline, while the g2p task's words (up to 24 tokens) and the gpu preset's 32-token rows
train another function. Deliberate check-gaming; not declared buggy.

Expected: ``check`` fails the component at the config's ``max_len`` and says where it goes wrong: "right up
to position 15, wrong from position 16 on".
"""
from __future__ import annotations

import torch

from harness import Component, Variant, hookimpl
from variants.feed_forward import PositionwiseFeedForward  # the paper's FFN; only the input is changed

NAME = "adv_ffn_mixes_after_16"
EXPECT_CHECK = "fail"
EXPECT_REASON = "not position-wise from position 16 on: x_t + 0.5 x_{t-1} there"


class MixingFeedForward(PositionwiseFeedForward):
    """w_2(relu(w_1 x')) with x'_t = x_t + 0.5 x_{t-1} for t >= 16 (the fault: x' should be x). Shape (B, L, D)."""

    def forward(self, x):
        if x.size(1) > 16:  # FAULT
            x = torch.cat([x[:, :16], x[:, 16:] + 0.5 * x[:, 15:-1]], dim=1)
        return super().forward(x)


@hookimpl
def harness_add_components():
    return [Component(NAME, "feed_forward", MixingFeedForward, "position-wise FFN, ReLU",
                      "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"feed_forward": NAME}, summary="baseline (FFN mixes positions after 16)",
                    source="adversarial test plugin")]
