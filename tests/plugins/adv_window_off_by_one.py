"""Adversarial plugin: a sliding-window mask keeping w + 1 keys.

Fault: the target mask keeps i - w <= j <= i (Mistral's "positions between i - W and i" read with both
ends included) where the window holds w keys, itself included (i - w < j <= i, HF Mistral's
``j > i - sliding_window``). Causal, padded keys blocked, nothing leaks; declared as the sliding-window
formula (``reference="causal_window"``), which it misses by one key per row.

Expected: ``check`` fails naming the fault ("a window of w + 1 keys").
"""
from __future__ import annotations

import torch

from harness import Component, Variant, hookimpl

NAME = "adv_window_off_by_one"
EXPECT_CHECK = "fail"
EXPECT_REASON = "a window of w + 1 keys"


class OffByOneWindow:
    """Bool keep-masks, fill -1e9; target (B, 1, T, T) with i - w <= j <= i (the fault)."""

    def __init__(self, window: int):
        self.window = window

    def src_mask(self, src, pad):
        return (src != pad)[:, None, None, :]  # (B, 1, 1, S)

    def tgt_mask(self, tgt, pad):
        t = tgt.size(1)
        i = torch.arange(t, device=tgt.device)[:, None]
        j = torch.arange(t, device=tgt.device)[None, :]
        return (tgt != pad)[:, None, None, :] & (j <= i) & (i - j <= self.window)  # FAULT: < meant

    def apply(self, scores, mask):
        return scores.masked_fill(~mask, -1e9)


@hookimpl
def harness_add_components():
    return [Component(NAME, "mask", lambda ctx: OffByOneWindow(ctx.cfg.sliding_window()),
                      "sliding window with w + 1 keys", "adversarial test plugin",
                      differs="sliding-window causal attention (Mistral)", reference="causal_window")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"mask": NAME}, summary="baseline with an off-by-one sliding window",
                    source="adversarial test plugin")]
