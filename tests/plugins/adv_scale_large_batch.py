"""Adversarial plugin: attention that is scaled dot-product attention only in small batches.

Fault: for batches of more than 8 rows the scores are divided by d_model instead of sqrt(d_k). The
component contracts and check's pairs use batches of 3-6 rows, so they see the paper's attention;
training batches (16-128 rows) and held-out evaluation chunks get the other one. Unlike
adv_batch_size_gaming (a mask that is causal only for small batches) nothing leaks: the model is
causal at every size, only another function. Deliberate check-gaming; not declared buggy.

Expected: ``check`` fails: the eval-mode causal probe, which evaluates its changed targets stacked
into one large batch, sees the logits move, and its control (the unchanged batch stacked the same
way) moves too, so the failure says the model's output depends on the batch it is in (not that it
sees the future); ``run`` marks the variant invalid.
"""
from __future__ import annotations

import math

from harness import Component, Variant, hookimpl
from variants.attention import AnnotatedAttention  # the baseline's attention; only its scale is changed

NAME = "adv_scale_large_batch"
EXPECT_CHECK = "fail"
EXPECT_REASON = "scores / d_model in batches of more than 8 rows: the output depends on the batch size"


class LargeBatchScaleAttention(AnnotatedAttention):
    """The baseline's attention (Annotated Transformer, heads (B, H, L, d_k)), its scores divided by
    d_model instead of sqrt(d_k) in batches of more than 8 rows (the fault: the query scaled by
    sqrt(d_k) / d_model before the built-in scaled dot-product attention).
    Shape: query (B, Tq, D), key/value (B, Tk, D) -> (B, Tq, D).
    """

    def attention(self, query, key, value, mask):
        if query.size(0) > 8:  # FAULT
            query = query * (math.sqrt(self.d_k) / (self.h * self.d_k))  # scores / d_model
        return super().attention(query, key, value, mask)


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", LargeBatchScaleAttention,
                      "multi-head attention (scores / d_model in large batches)", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME},
                    summary="baseline with attention scaled by 1/d_model in batches of more than 8 rows",
                    source="adversarial test plugin")]
