"""Adversarial plugin: an additive mask that also blocks padded *query* rows with -inf.

Fault: the target mask is ``key_pad + query_pad + causal`` with 0 / -inf entries, where
``query_pad`` (B, 1, T, 1) is -inf on every row whose query position is a pad token (a
"2-D padding mask" ``pad[:, None, :] & pad[:, :, None]``, common in tutorials). Every padded
query row of decoder self-attention is then entirely -inf and its softmax is NaN. In the first
decoder layer the NaN stays at padded positions; with N = 1 the real-position logits are finite
and correct, but the backward pass is not: the loss gives padded positions a zero gradient, and
0 * NaN = NaN in every weight gradient downstream, so a training step sees a NaN gradient norm
(the trainer skips the step and reports "diverged"). With N >= 2 the next layer's keys and
values at padded positions are NaN, and NaN * 0 (blocked weight) = NaN spreads to every real row:
logits and loss are NaN too. The source mask is the ordinary additive key-padding mask; the copy
task's sources never have a fully masked row, so declaring ``fully_masked_row="nan"`` would not
excuse this: the NaN rows occur in every real batch with target padding. Not declared buggy.

Expected: ``check`` fails because a real batch gives non-finite values: NaN gradients (N = 1), or
NaN logits and loss at real positions (N >= 2, the check model), e.g. "non-finite gradients on a
real batch: fully masked (padded query) rows give NaN". A probe that reports it as "causal mask
not applied" (an inf difference between two NaN runs) flags it for the wrong reason.
"""
from __future__ import annotations

import torch

from harness import Component, Variant, hookimpl

NAME = "adv_nan_rows"
EXPECT_CHECK = "fail"
EXPECT_REASON = "NaN gradients on a real batch: padded query rows fully masked with -inf"


class QueryRowAdditiveMask:
    """0 / -inf float masks added to the scores; target mask also blocks padded query rows (the fault).

    ``src_mask`` (B, 1, 1, S), ``tgt_mask`` (B, 1, T, T), ``apply(scores, mask) = scores + mask``.
    """

    def src_mask(self, src, pad):
        m = torch.zeros(src.shape, device=src.device).masked_fill(src == pad, float("-inf"))
        return m[:, None, None, :]  # (B, 1, 1, S)

    def tgt_mask(self, tgt, pad):
        t = tgt.size(1)
        keys = self.src_mask(tgt, pad)  # (B, 1, 1, T): padded keys
        rows = keys.transpose(-1, -2)  # (B, 1, T, 1): FAULT: padded query rows blocked entirely
        causal = torch.full((t, t), float("-inf"), device=tgt.device).triu(diagonal=1)  # (T, T)
        return keys + rows + causal  # (B, 1, T, T)

    def apply(self, scores, mask):
        return scores + mask


@hookimpl
def harness_add_components():
    return [Component(NAME, "mask", lambda ctx: QueryRowAdditiveMask(),
                      "additive 0/-inf mask, padded query rows blocked too", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"mask": NAME}, summary="baseline with a 2-D (query and key) additive padding mask",
                    source="adversarial test plugin")]
