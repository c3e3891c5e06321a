"""Adversarial plugin: a causal mask that lets positions from 16 on see the next target token.

Fault: the target mask is the paper's (padding and ``tril``) for query positions 0-15; from position 16 on
each position also keeps the key right after it (``tril(diagonal=1)`` on those rows), so in the copy task
position i >= 16 sees its own label. Every batch the checks fed stopped at 12 target positions (the mask
contract's batches: T = 10 and 12; the model probes': T = 10), so ``check`` passed it and classed it the
baseline's function, while the g2p task's words (up to 24 tokens) and the quick preset's copy rows (up to
21) train with the leak. Bool keep-mask (True = attend), applied with ``masked_fill(mask == 0, -1e9)``.
Deliberate check-gaming; not declared buggy.

Expected: ``check`` fails with a causal leak at a long row ("decoder position 16 changed ... when the
target tokens after position 16 ...": the checks' batch now has 2 rows as long as ``max_len``).
"""
from __future__ import annotations

import torch

from harness import Component, Variant, hookimpl
from variants.mask import BoolMask  # the paper's mask; only the causal part is changed

NAME = "adv_causal_leak_after_16"
EXPECT_CHECK = "fail"
EXPECT_REASON = "causal leak from position 16 on: position i >= 16 sees target token i + 1"


class LeakAfter16Mask(BoolMask):
    """The paper's bool keep-masks, except rows 16+ of the causal part keep one key ahead (the fault).

    ``tgt_mask`` (B, 1, T, T); ``src_mask`` and ``apply`` are the baseline's.
    """

    def tgt_mask(self, tgt, pad):
        t = tgt.size(1)
        causal = torch.ones(t, t, dtype=torch.bool, device=tgt.device).tril()
        causal[16:] = torch.ones(t, t, dtype=torch.bool, device=tgt.device).tril(diagonal=1)[16:]  # FAULT
        return (tgt != pad)[:, None, None, :] & causal  # (B, 1, T, T)


@hookimpl
def harness_add_components():
    return [Component(NAME, "mask", lambda ctx: LeakAfter16Mask(),
                      "bool keep-mask, causal part tril", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"mask": NAME}, summary="baseline whose causal mask leaks one token ahead from position 16",
                    source="adversarial test plugin")]
