"""Adversarial plugin: attention that is scaled dot-product attention except under ``torch.inference_mode``.

Fault: under ``torch.inference_mode`` (how held-out evaluation and decoding run the model) the scores
are divided by d_model instead of sqrt(d_k). The component contracts run under ``no_grad``, the
pairs and the training-mode comparison with autograd on, and the eval-mode probes compare two
forwards that are both under inference mode (so both wrong the same way, no leak): all of them see
or accept the paper's attention, while every held-out score comes from another function, and a
variant classed "same function" as the baseline would be scored as something else. Deliberate
check-gaming; not declared buggy.

Expected: ``check`` fails on "training = evaluation (dropout 0)": the evaluation-mode logits under
``torch.inference_mode`` differ from those with autograd on; ``run`` marks the variant invalid.
"""
from __future__ import annotations

import math

import torch

from harness import Component, Variant, hookimpl
from variants.attention import AnnotatedAttention  # the baseline's attention; only its scale is changed

NAME = "adv_scale_in_inference"
EXPECT_CHECK = "fail"
EXPECT_REASON = "scores / d_model under torch.inference_mode (held-out evaluation), / sqrt(d_k) otherwise"


class InferenceScaleAttention(AnnotatedAttention):
    """The baseline's attention (Annotated Transformer, heads (B, H, L, d_k)), its scores divided by
    d_model instead of sqrt(d_k) under inference mode (the fault: the query scaled by sqrt(d_k) / d_model before
    the built-in scaled dot-product attention). Shape: query (B, Tq, D), key/value (B, Tk, D) -> (B, Tq, D).
    """

    def attention(self, query, key, value, mask):
        if torch.is_inference_mode_enabled():  # FAULT
            query = query * (math.sqrt(self.d_k) / (self.h * self.d_k))  # scores / d_model
        return super().attention(query, key, value, mask)


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", InferenceScaleAttention,
                      "multi-head attention (scores / d_model under inference mode)", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME},
                    summary="baseline with attention scaled by 1/d_model under inference mode",
                    source="adversarial test plugin")]
