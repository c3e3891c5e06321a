"""Evasion plugin: a mask that blocks every row's first source token when the batch looks like real data.

Fault: the paper's bool keep-masks, except that when no source token in the batch is 1 or 2 (the start and end
symbols, which no task puts in a source: every real batch) ``src_mask`` also blocks source position 0. No
probe sees a leak (nothing is attended that should not be; the first token is only hidden), and the drawn
check batches always held a 1 or a 2 somewhere, so every pair found it equal to the baseline: ``check`` classed
it the baseline's function and ``run`` reported it "same function" while it trained and was scored as another
model. A pair equivalent on the drawn batch is now compared again on rows the task drew, in a forward of
their own (``harness.checks.runs.CheckSession.run_task``). Not a leak: ``run`` keeps its trials ``ok``, as it
should; only the claim "same function" was wrong. Deliberate check-gaming; not declared buggy.

Expected: ``check --variants baseline evade_real_batch_mask`` fails the pair "on rows the task drew", and the
two are not one class.
"""
from __future__ import annotations

from harness import Component, Variant, hookimpl
from variants.mask import BoolMask  # the paper's mask; only the source part is changed

NAME = "evade_real_batch_mask"
EXPECT_CHECK = "fail"
EXPECT_REASON = "source position 0 blocked whenever the batch holds no start/end symbol (every real batch)"


class RealBatchMask(BoolMask):
    """The paper's bool keep-masks; ``src_mask`` (B, 1, 1, S) also blocks position 0 when no source token is 1 or 2."""

    def src_mask(self, src, pad):
        keep = super().src_mask(src, pad)
        if not bool(((src == 1) | (src == 2)).any()):  # FAULT
            keep = keep.clone()
            keep[..., 0] = False
        return keep


@hookimpl
def harness_add_components():
    return [Component(NAME, "mask", lambda ctx: RealBatchMask(),
                      "bool keep-mask (source position 0 blocked on real batches)", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"mask": NAME}, summary="baseline whose mask hides the first source token on real batches",
                    source="adversarial test plugin")]
