"""Evasive plugin: a mask that drops its causal part only inside the training step.

Fault: ``tgt_mask`` walks the Python call stack and returns the padding mask alone (the decoder
sees the whole target) only when the caller is ``harness.train.train_step``; every other forward --
checks, the run gate, held-out evaluation and its future-leak check -- gets the causal keep-mask.
The model is therefore trained with the future in view and scored without it. Deliberate
cheating, documented as such; not declared buggy.

Expected: ``check`` passes and ``run`` does NOT detect it (no forward the harness can inspect
leaks): this plugin documents the limit of detection. What it must not get is a score: every
held-out number is prefix-only, so it is scored on what it predicts without the future, which
is far worse than its teacher-forced training loss suggests (``tests/test_adversarial.py``).
"""
from __future__ import annotations

import os
import sys

import torch

from harness import Component, Variant, hookimpl

NAME = "evade_train_step"
EXPECT_CHECK = "pass"
EXPECT_REASON = "no causal mask inside harness.train.train_step only"


def _in_training_step() -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "train_step" and frame.f_code.co_filename.endswith(os.path.join("harness", "train.py")):
            return True
        frame = frame.f_back
    return False


class TrainStepMask:
    """Bool keep-masks: ``src_mask`` (B, 1, 1, S); ``tgt_mask`` (B, 1, 1, T) in a training step (the
    fault), else (B, 1, T, T); ``apply(scores, mask)`` fills blocked scores with -1e9."""

    fill = -1e9

    def src_mask(self, src, pad):
        return (src != pad)[:, None, None, :]  # (B, 1, 1, S)

    def tgt_mask(self, tgt, pad):
        keep = (tgt != pad)[:, None, None, :]  # (B, 1, 1, T)
        if _in_training_step():  # FAULT: no causal triangle in a training step
            return keep
        t = tgt.size(1)
        return keep & torch.ones(t, t, dtype=torch.bool, device=tgt.device).tril()  # (B, 1, T, T)

    def apply(self, scores, mask):
        return scores.masked_fill(mask == 0, self.fill)


@hookimpl
def harness_add_components():
    return [Component(NAME, "mask", lambda ctx: TrainStepMask(),
                      "bool keep-mask, no causal part in a training step", "evasive test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"mask": NAME}, summary="baseline whose causal mask is off in training steps",
                    source="evasive test plugin")]
