"""Adversarial plugin: a mask that drops the source padding mask when the source holds no special token.

Fault: the paper's bool keep-masks, except that ``src_mask`` keeps every key when no source token is 1 or 2
(the start and end symbols, which every task keeps out of its sources): on every real batch the encoder
and the cross-attention attend to the padding. The checks' batches, and the run gate's, drew their tokens
from every non-pad id, so some source always held a 1 or a 2: ``check`` passed it and classed it the
baseline's function, and ``run`` trained it and called it "same function" as the baseline, with its trials
``ok``. The model probes now also run on rows the task itself drew (``harness.checks.properties.rows.task_rows``):
the data a component sees in training, whatever it branches on. Deliberate check-gaming; not declared buggy.

Expected: ``check`` fails on masked source keys "on rows the task drew"; ``run`` marks the variant invalid
at initialisation.
"""
from __future__ import annotations

import torch

from harness import Component, Variant, hookimpl
from variants.mask import BoolMask  # the paper's mask; only the source part is changed

NAME = "adv_source_without_specials"
EXPECT_CHECK = "fail"
EXPECT_REASON = "source padding attended whenever the source holds no start/end symbol (every real batch)"


class NoSpecialsMask(BoolMask):
    """The paper's bool keep-masks; ``src_mask`` (B, 1, 1, S) all True when no source token is 1 or 2 (the fault)."""

    def src_mask(self, src, pad):
        keep = super().src_mask(src, pad)
        if not bool(((src == 1) | (src == 2)).any()):  # FAULT
            return torch.ones_like(keep)
        return keep


@hookimpl
def harness_add_components():
    return [Component(NAME, "mask", lambda ctx: NoSpecialsMask(),
                      "bool keep-mask (source padding kept on sources without special ids)", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"mask": NAME}, summary="baseline whose source mask keeps padding on real sources",
                    source="adversarial test plugin")]
