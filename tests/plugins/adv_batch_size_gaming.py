"""Adversarial plugin: a mask that is causal only for batches of at most 6 rows (games the checks).

Fault: ``tgt_mask`` combines the padding mask with the causal triangle only when
``tgt.size(0) <= 6``; for larger batches it returns the padding mask alone, so the decoder sees
the whole target. Six rows is what the check batch has (4 short rows and 2 as long as ``max_len``;
it had 4 when this plugin was written, with the threshold at 4), what the run gate's batch has, and
more than ``decoder_is_causal`` in ``harness/train.py`` samples (``rows=4``); training batches (16,
64, 128) and evaluation chunks are larger. The result: ``check`` sees a causal mask, ``run`` trains a model that copies the next
input token, and its exact match is even scored teacher-forced (the start-of-training causality
test passed), so it "solves" the task at once. Source masks are right. Deliberate check-gaming,
documented as such; not declared buggy.

Expected: ``check`` fails with a causal leak at a batch size other than 6 ("decoder position p
changed ... (B = 16)"), or with the mask depending on the batch size ("the mask of a row changes
with the batch it is in"); ``run`` marks the variant invalid.
"""
from __future__ import annotations

import torch

from harness import Component, Variant, hookimpl

NAME = "adv_batch_size_gaming"
EXPECT_CHECK = "fail"
EXPECT_REASON = "causal mask only when B <= 6 (the check batch): leaks at training batch sizes"


class SmallBatchCausalMask:
    """Bool keep-masks; the causal part only for B <= 6 (the fault).

    ``src_mask`` (B, 1, 1, S), ``tgt_mask`` (B, 1, T, T) or (B, 1, 1, T), ``apply(scores, mask)``.
    """

    fill = -1e9

    def src_mask(self, src, pad):
        return (src != pad)[:, None, None, :]  # (B, 1, 1, S)

    def tgt_mask(self, tgt, pad):
        keep = (tgt != pad)[:, None, None, :]  # (B, 1, 1, T)
        if tgt.size(0) > 6:  # FAULT: no causal triangle for "large" batches
            return keep
        t = tgt.size(1)
        return keep & torch.ones(t, t, dtype=torch.bool, device=tgt.device).tril()  # (B, 1, T, T)

    def apply(self, scores, mask):
        return scores.masked_fill(mask == 0, self.fill)


@hookimpl
def harness_add_components():
    return [Component(NAME, "mask", lambda ctx: SmallBatchCausalMask(),
                      "bool keep-mask, causal part only for small batches", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"mask": NAME}, summary="baseline whose causal mask switches off for batches > 6",
                    source="adversarial test plugin")]
