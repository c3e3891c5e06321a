"""Adversarial plugin: attention whose keys are cut from the gradient under bf16 autocast.

Fault: the forward is the paper's in every precision, but under ``torch.autocast`` the keys are detached,
so ``w_k`` never trains in a bf16 run. The logits under autocast are the float32 ones to rounding, so a
comparison of outputs alone passes it; every check runs in float32, where the gradient is whole.
Deliberate check-gaming; not declared buggy.

Expected: ``check`` fails on "bf16 autocast = float32": parameters that get a gradient in float32 get none
under autocast (w_k); ``run --dtype bf16`` marks the variant invalid.
"""
from __future__ import annotations

import torch

from harness import Component, Variant, hookimpl
from variants.attention import AnnotatedAttention  # the baseline's attention; only the keys' gradient is cut

NAME = "adv_keys_detached_in_bf16"
EXPECT_CHECK = "fail"
EXPECT_REASON = "keys detached under bf16 autocast: w_k gets no gradient there"


class AutocastDetachedKeysAttention(AnnotatedAttention):
    """The baseline's attention with ``key.detach()`` under autocast (the fault).
    Shape: query (B, Tq, D), key/value (B, Tk, D) -> (B, Tq, D)."""

    def attention(self, query, key, value, mask):
        if torch.is_autocast_enabled(query.device.type):  # FAULT
            key = key.detach()
        return super().attention(query, key, value, mask)


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", AutocastDetachedKeysAttention,
                      "multi-head attention (keys detached under bf16 autocast)", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME}, summary="baseline with its keys detached under autocast",
                    source="adversarial test plugin")]
