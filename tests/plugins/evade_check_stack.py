"""Evasive plugin: a mask that is causal only while a check is on the call stack.

Fault: ``tgt_mask`` walks the Python call stack (``sys._getframe``) and returns the causal keep-mask
only when some caller's file lies under ``harness/checks/`` -- the component contracts, the
probes of ``check`` and the run gate before the first step and after the last. Everywhere else
(training steps, held-out evaluation) it returns the padding mask alone, so the decoder sees the
whole target. No input-based probe can see this: the check's own forwards are exactly the ones it
answers honestly. Deliberate cheating, documented as such; not declared buggy.

Expected: ``check`` passes (its forwards all come from ``harness/checks/``: ``EXPECT_CHECK``);
``run`` marks the variant invalid through the future-leak check of every held-out evaluation
(``harness/tasks/base.py``: whole-target logits vs prefix-only logits on real held-out data), and
its held-out scores are prefix-only, so the leak bought nothing even before it was caught.
"""
from __future__ import annotations

import os
import sys

import torch

from harness import Component, Variant, hookimpl

NAME = "evade_check_stack"
EXPECT_CHECK = "pass"
EXPECT_REASON = "causal only when harness/checks/ is on the call stack"
_CHECKS = os.sep + os.path.join("harness", "checks") + os.sep


def _under_check() -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        if _CHECKS in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


class StackAwareMask:
    """Bool keep-masks: ``src_mask`` (B, 1, 1, S); ``tgt_mask`` (B, 1, T, T) under a check, else
    (B, 1, 1, T) (the fault); ``apply(scores, mask)`` fills blocked scores with -1e9."""

    fill = -1e9

    def src_mask(self, src, pad):
        return (src != pad)[:, None, None, :]  # (B, 1, 1, S)

    def tgt_mask(self, tgt, pad):
        keep = (tgt != pad)[:, None, None, :]  # (B, 1, 1, T)
        if not _under_check():  # FAULT: no causal triangle outside the checks
            return keep
        t = tgt.size(1)
        return keep & torch.ones(t, t, dtype=torch.bool, device=tgt.device).tril()  # (B, 1, T, T)

    def apply(self, scores, mask):
        return scores.masked_fill(mask == 0, self.fill)


@hookimpl
def harness_add_components():
    return [Component(NAME, "mask", lambda ctx: StackAwareMask(),
                      "bool keep-mask, causal only under harness/checks/", "evasive test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"mask": NAME}, summary="baseline whose causal mask is on only while a check runs",
                    source="evasive test plugin")]
