"""Adversarial plugin: a causal mask shifted by one, ``tril(diagonal=1)``: position i sees i + 1.

Fault: the mask component's target mask keeps the keys ``j <= i + 1`` (``torch.ones(T, T).tril(1)``)
instead of ``j <= i``, so every decoder position sees the next target token -- in the copy task
that is exactly its label. Padding masks are right. Convention: bool keep-mask (True = attend),
applied with ``masked_fill(mask == 0, -1e9)``; fully masked row: uniform (finite). The component
is *not* declared buggy.

Expected: ``check`` fails with a causal leak: "decoder position p changed ... when the target
tokens after position p changed ... causal mask not applied" and the mask component's causal mask
letting future keys through ("the causal mask lets future and padded target keys through").
"""
from __future__ import annotations

import torch

from harness import Component, Variant, hookimpl

NAME = "adv_causal_shift"
EXPECT_CHECK = "fail"
EXPECT_REASON = "causal leak: position i sees target token i + 1"


class ShiftedCausalMask:
    """Bool keep-masks; the causal part is ``tril(diagonal=1)`` (the fault).

    ``src_mask`` (B, 1, 1, S), ``tgt_mask`` (B, 1, T, T), ``apply(scores (..., Tq, Tk), mask)``.
    """

    fill = -1e9

    def src_mask(self, src, pad):
        return (src != pad)[:, None, None, :]  # (B, 1, 1, S)

    def tgt_mask(self, tgt, pad):
        t = tgt.size(1)
        causal = torch.ones(t, t, dtype=torch.bool, device=tgt.device).tril(diagonal=1)  # FAULT: diagonal=0
        return (tgt != pad)[:, None, None, :] & causal  # (B, 1, T, T)

    def apply(self, scores, mask):
        return scores.masked_fill(mask == 0, self.fill)


@hookimpl
def harness_add_components():
    return [Component(NAME, "mask", lambda ctx: ShiftedCausalMask(),
                      "bool keep-mask, causal part tril(diagonal=1)", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"mask": NAME}, summary="baseline whose causal mask lets position i see i + 1",
                    source="adversarial test plugin")]
