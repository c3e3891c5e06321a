"""Adversarial plugin: attention that divides its scores by d_model when it has a single query.

Fault: scaled dot-product attention (Vaswani et al. 2017 §3.2.1) for every input with two or more
query positions; with one query (a decoder input of width 1: the first position of a held-out row,
scored from a forward that holds only the start symbol, and the first step of greedy decoding) the
scores are divided by d_model instead of sqrt(d_k). Every check batch kept the target's full width
(10, 12 or ``max_len`` positions), so ``check`` passed it and classed it the baseline's function; a
trial trains on whole targets (one function) and scores position 0 from a width-1 forward (another).
``run`` already caught it: every evaluation compares prefix-only with whole-target logits on
held-out rows (:func:`harness.tasks.base.future_leak`). Deliberate check-gaming; not declared buggy.

Expected: ``check`` fails on the model probe "prefix = whole target" ("the logits at target position 0
from a decoder input that ends there (width 1 ..."); ``run`` marks the variant invalid.
"""
from __future__ import annotations

import math

from harness import Component, Variant, hookimpl
from variants.attention import AnnotatedAttention  # the baseline's attention; only its scale is changed

NAME = "adv_single_query_scale"
EXPECT_CHECK = "fail"
EXPECT_REASON = "scores / d_model when there is one query: position 0 is scored by another function"


class SingleQueryScaleAttention(AnnotatedAttention):
    """The baseline's attention (heads (B, H, L, d_k)), its scores divided by d_model instead of sqrt(d_k)
    when Tq = 1 (the fault). Shape: query (B, Tq, D), key/value (B, Tk, D) -> (B, Tq, D)."""

    def attention(self, query, key, value, mask):
        if query.size(-2) == 1:  # FAULT
            query = query * (math.sqrt(self.d_k) / (self.h * self.d_k))  # scores / d_model
        return super().attention(query, key, value, mask)


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", SingleQueryScaleAttention,
                      "multi-head attention (scores / d_model for a single query)", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME}, summary="baseline whose attention rescales a single query",
                    source="adversarial test plugin")]
