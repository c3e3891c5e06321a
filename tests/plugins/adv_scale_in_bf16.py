"""Adversarial plugin: attention that is scaled dot-product attention except under bf16 autocast.

Fault: when ``torch.autocast`` is on (``run --dtype bf16``, how the GPU runs train g2p) the scores are
divided by d_model instead of sqrt(d_k). Every check compares float32 models: the component contracts
(float64), the pairs and the references that ``run`` records as equivalence classes, the training =
evaluation item. So the variant is classed "same function" as the baseline while its bf16 trials train
another function, and a report would say that the baseline's attention and this one cannot differ.
Deliberate check-gaming; not declared buggy.

Expected: ``check`` fails on "bf16 autocast = float32": the logits under autocast move far more than rounding
the weights to bf16 moves them; ``run --dtype bf16`` marks the variant invalid (its fp32 trials stay ok).
"""
from __future__ import annotations

import math

import torch

from harness import Component, Variant, hookimpl
from variants.attention import AnnotatedAttention  # the baseline's attention; only its scale is changed

NAME = "adv_scale_in_bf16"
EXPECT_CHECK = "fail"
EXPECT_REASON = "scores / d_model under bf16 autocast, / sqrt(d_k) otherwise"


class AutocastScaleAttention(AnnotatedAttention):
    """The baseline's attention (Annotated Transformer, heads (B, H, L, d_k)), its scores divided by d_model
    instead of sqrt(d_k) under autocast (the fault: the query scaled by sqrt(d_k) / d_model first).
    Shape: query (B, Tq, D), key/value (B, Tk, D) -> (B, Tq, D)."""

    def attention(self, query, key, value, mask):
        if torch.is_autocast_enabled(query.device.type):  # FAULT
            query = query * (math.sqrt(self.d_k) / (self.h * self.d_k))  # scores / d_model
        return super().attention(query, key, value, mask)


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", AutocastScaleAttention,
                      "multi-head attention (scores / d_model under bf16 autocast)", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME}, summary="baseline with attention scaled by 1/d_model under autocast",
                    source="adversarial test plugin")]
