"""Adversarial plugin: a feed-forward that treats batch rows 16 and later differently (x 1.5 on its output).

Fault: the position-wise FFN of the paper (Vaswani et al. 2017 §3.3), except that in a batch of more
than 16 rows the outputs of rows 16, 17, ... are scaled by 1.5. Every comparison with a reference and
every pair runs on batches of 2-6 rows, where it is the paper's FFN; training batches (32-512 rows) and
evaluation chunks are larger, so a trial trains and is scored as another function. The eval-mode
causal probe stacks its changed targets into one forward of many rows and sees position 0 move: until
its control ("the unchanged batch stacked the same way") compared every stacked copy, not only the
first B rows, the leak was blamed on the model seeing the future through the padding. Deliberate
check-gaming; not declared buggy.

Expected: ``check`` fails with "the model's output depends on the batch it is in" (the control's rows
past index 16 move); ``run`` marks the variant invalid (the run gate runs the same probe).
"""
from __future__ import annotations

import torch

from harness import Component, Variant, hookimpl
from variants.feed_forward import PositionwiseFeedForward  # the paper's FFN; only rows 16+ are changed

NAME = "adv_rows_by_index"
EXPECT_CHECK = "fail"
EXPECT_REASON = "rows 16+ of a batch scaled by 1.5: the output depends on the batch it is in"


class RowIndexFeedForward(PositionwiseFeedForward):
    """The paper's FFN, rows 16+ of a batch of more than 16 scaled by 1.5 (the fault). Shape: (B, L, D) -> (B, L, D)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        if x.dim() == 3 and x.size(0) > 16:  # FAULT
            y = torch.cat([y[:16], y[16:] * 1.5])
        return y


@hookimpl
def harness_add_components():
    return [Component(NAME, "feed_forward", RowIndexFeedForward,
                      "position-wise FFN (rows 16+ of a batch x 1.5)", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"feed_forward": NAME}, summary="baseline whose FFN scales batch rows 16 and later",
                    source="adversarial test plugin")]
