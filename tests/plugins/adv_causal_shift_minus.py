"""Adversarial plugin: a causal mask shifted the other way, ``tril(diagonal=-1)``.

Fault: the target mask keeps the keys ``j <= i - 1`` (``torch.ones(T, T).tril(-1)``) instead of
``j <= i``: position i cannot attend to itself, and row 0 keeps no key at all. With the bool
``masked_fill(mask == 0, -1e9)`` convention row 0's softmax is then *uniform over every key*,
future and padding included -- position 0 of every decoder self-attention sees the whole
target. Padding masks are right. Not declared buggy.

Expected: ``check`` fails: the causal probe reports "decoder position 0 changed ... when the target
tokens after position 0 changed ... causal mask not applied", and the mask component's causal mask
differs from the reference masked softmax (kept keys blocked / row 0 fully masked).
"""
from __future__ import annotations

import torch

from harness import Component, Variant, hookimpl

NAME = "adv_causal_shift_minus"
EXPECT_CHECK = "fail"
EXPECT_REASON = "causal mask wrong: position i cannot see itself, row 0 fully masked (uniform over the future)"


class DiagonalExcludedMask:
    """Bool keep-masks; the causal part is ``tril(diagonal=-1)`` (the fault).

    ``src_mask`` (B, 1, 1, S), ``tgt_mask`` (B, 1, T, T), ``apply(scores (..., Tq, Tk), mask)``.
    """

    fill = -1e9

    def src_mask(self, src, pad):
        return (src != pad)[:, None, None, :]  # (B, 1, 1, S)

    def tgt_mask(self, tgt, pad):
        t = tgt.size(1)
        causal = torch.ones(t, t, dtype=torch.bool, device=tgt.device).tril(diagonal=-1)  # FAULT: diagonal=0
        return (tgt != pad)[:, None, None, :] & causal  # (B, 1, T, T)

    def apply(self, scores, mask):
        return scores.masked_fill(mask == 0, self.fill)


@hookimpl
def harness_add_components():
    return [Component(NAME, "mask", lambda ctx: DiagonalExcludedMask(),
                      "bool keep-mask, causal part tril(diagonal=-1)", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"mask": NAME}, summary="baseline whose causal mask hides each position from itself",
                    source="adversarial test plugin")]
