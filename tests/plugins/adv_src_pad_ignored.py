"""Adversarial plugin: a source mask that ignores padding (all ones); the target mask is right.

Fault: ``src_mask`` returns a keep-mask of all True, (B, 1, 1, S), so encoder self-attention and
decoder cross-attention attend to padded source positions. ``tgt_mask`` is the correct
``(tgt != pad) & tril`` keep-mask, so every causal probe passes. Convention: bool keep-mask,
``masked_fill(mask == 0, -1e9)``. Not declared buggy.

Expected: ``check`` fails on the padding: "real target positions changed ... when the tokens at
padded source positions changed ... padding mask not applied", and the mask component's padding
mask "changes nothing: padded source keys get attention weight up to ...".
"""
from __future__ import annotations

import torch

from harness import Component, Variant, hookimpl

NAME = "adv_src_pad_ignored"
EXPECT_CHECK = "fail"
EXPECT_REASON = "padding mask not applied: padded source keys get attention weight"


class NoSourcePaddingMask:
    """Bool keep-masks; the source mask keeps every position (the fault).

    ``src_mask`` (B, 1, 1, S), ``tgt_mask`` (B, 1, T, T), ``apply(scores (..., Tq, Tk), mask)``.
    """

    fill = -1e9

    def src_mask(self, src, pad):
        return torch.ones_like(src, dtype=torch.bool)[:, None, None, :]  # FAULT: should be src != pad

    def tgt_mask(self, tgt, pad):
        t = tgt.size(1)
        causal = torch.ones(t, t, dtype=torch.bool, device=tgt.device).tril()  # (T, T)
        return (tgt != pad)[:, None, None, :] & causal  # (B, 1, T, T)

    def apply(self, scores, mask):
        return scores.masked_fill(mask == 0, self.fill)


@hookimpl
def harness_add_components():
    return [Component(NAME, "mask", lambda ctx: NoSourcePaddingMask(),
                      "bool keep-mask; the source mask keeps every position", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"mask": NAME}, summary="baseline whose source mask ignores padding",
                    source="adversarial test plugin")]
