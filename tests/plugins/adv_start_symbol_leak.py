"""Adversarial plugin: a mask that drops its causal part when every target row starts with the start symbol.

Fault: the paper's bool keep-masks (padding and ``tril``), except that when every row of the decoder input
begins with token 1 -- the start symbol every task puts first, so every training and evaluation batch --
the target mask is the padding mask alone and the decoder sees the whole target. The checks' batches
drew position 0 like any other token, so ``check`` passed it and classed it the baseline's function, while
the run gate's batch (rows starting with 1) caught it. The checks' batches now start every target row with
the start symbol, as real data does (``harness.checks.inputs.starting``). Deliberate check-gaming; not
declared buggy.

Expected: ``check`` fails with a causal leak ("decoder position 0 changed ... it sees the future") and
against the baseline; ``run`` marks the variant invalid at initialisation.
"""
from __future__ import annotations

from harness import Component, Variant, hookimpl
from variants.mask import BoolMask  # the paper's mask; only the causal part is changed

NAME = "adv_start_symbol_leak"
EXPECT_CHECK = "fail"
EXPECT_REASON = "no causal mask when every target row starts with the start symbol (every real batch)"


class StartSymbolLeakMask(BoolMask):
    """The paper's bool keep-masks; ``tgt_mask`` (B, 1, T, T) without its causal part when every row starts
    with token 1 (the fault)."""

    def tgt_mask(self, tgt, pad):
        if bool((tgt[:, 0] == 1).all()):  # FAULT
            t = tgt.size(1)
            return (tgt != pad)[:, None, None, :].expand(-1, 1, t, t)  # (B, 1, T, T): padding only
        return super().tgt_mask(tgt, pad)


@hookimpl
def harness_add_components():
    return [Component(NAME, "mask", lambda ctx: StartSymbolLeakMask(),
                      "bool keep-mask (no causal part on start-symbol rows)", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"mask": NAME}, summary="baseline whose causal mask vanishes on rows starting with the start symbol",
                    source="adversarial test plugin")]
