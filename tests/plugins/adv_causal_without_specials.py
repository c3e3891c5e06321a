"""Adversarial plugin: a mask that drops the causal part when no target token after position 0 is the start symbol.

Fault: the paper's bool keep-masks, except that ``tgt_mask`` keeps every real key (the decoder sees the whole
target) when token 1, the start symbol, appears nowhere in the target but at position 0 -- true of every target a
task draws (the start symbol opens a row and never recurs), false of the checks' drawn batches, whose positions
after 0 take every non-pad id. Every drawn-batch probe passes; the rows the task drew
(``harness.checks.properties.rows.task_rows``) show the leak. The target-side twin of
``adv_source_without_specials``, and the plugin the table row "causal leak (task rows)" is held to
(``tests/test_properties.py``). Deliberate check-gaming; not declared buggy.

Expected: ``check`` fails on the causal probe "on rows the task drew"; ``run`` marks the variant invalid at
initialisation.
"""
from __future__ import annotations

from harness import Component, Variant, hookimpl
from variants.mask import BoolMask  # the paper's mask; only the target part is changed

NAME = "adv_causal_without_specials"
EXPECT_CHECK = "fail"
EXPECT_REASON = "causal mask dropped whenever the start symbol appears only at position 0 (every real target)"


class StartOnlyMask(BoolMask):
    """The paper's bool keep-masks; ``tgt_mask`` (B, 1, T, T) is the padding mask alone when no target token after
    position 0 is 1 (the fault)."""

    def tgt_mask(self, tgt, pad):
        keep = super().tgt_mask(tgt, pad)
        if not bool((tgt[:, 1:] == 1).any()):  # FAULT
            return (tgt != pad)[:, None, None, :].expand_as(keep)
        return keep


@hookimpl
def harness_add_components():
    return [Component(NAME, "mask", lambda ctx: StartOnlyMask(),
                      "bool keep-mask (causal part dropped on real targets)", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"mask": NAME}, summary="baseline whose target mask sees the future on real targets",
                    source="adversarial test plugin")]
