"""Adversarial plugin: attention that is scaled dot-product attention in evaluation only.

Fault: in training mode the scores are divided by d_model (adv_scale_d_model's fault); in evaluation
mode by sqrt(d_k), as Vaswani et al. 2017 §3.2.1 say. Every comparison with a reference runs in
evaluation mode (the attention contract, ``nn.MultiheadAttention``, ``nn.Transformer``, check's
pairs), and no probe leaks (masks are applied in both modes), so such a component used to pass
``check`` and be classed "same function" as the baseline: ``run`` would then have trained a
different model and reported it as the baseline's function, with no verdict. Deliberate
check-gaming; not declared buggy.

Expected: ``check`` fails on the model contract item "training = evaluation (dropout 0)" (the
training-mode logits differ from the evaluation-mode ones); ``run`` marks the variant invalid.
"""
from __future__ import annotations

import math

from harness import Component, Variant, hookimpl
from variants.attention import AnnotatedAttention  # the baseline's attention; only its scale is changed

NAME = "adv_scale_in_training"
EXPECT_CHECK = "fail"
EXPECT_REASON = "scores / d_model in training, / sqrt(d_k) in evaluation: the training forward differs"


class TrainingScaleAttention(AnnotatedAttention):
    """The baseline's attention (Annotated Transformer, heads (B, H, L, d_k)), its scores divided by
    d_model instead of sqrt(d_k) in training (the fault: the query scaled by sqrt(d_k) / d_model before
    the built-in scaled dot-product attention). Shape: query (B, Tq, D), key/value (B, Tk, D) -> (B, Tq, D).
    """

    def attention(self, query, key, value, mask):
        if self.training:  # FAULT
            query = query * (math.sqrt(self.d_k) / (self.h * self.d_k))  # scores / d_model
        return super().attention(query, key, value, mask)


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", TrainingScaleAttention,
                      "multi-head attention (scores / d_model in training)", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME},
                    summary="baseline with attention scaled by 1/d_model in training",
                    source="adversarial test plugin")]
