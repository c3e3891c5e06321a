"""Evasion plugin (on a machine without CUDA): attention that is scaled dot-product attention on the CPU and
another one on a GPU.

Fault: on a CUDA tensor the scores are divided by d_model instead of sqrt(d_k) (as code does when it takes a
fused kernel on the GPU with another scale than its CPU path). ``run`` records its classes from CPU
comparisons and the component contracts run on the CPU: the variant would be classed "same function" as the
baseline while its GPU trials trained another function. Deliberate check-gaming; not declared buggy. On a
machine without CUDA it is the paper's attention.

Expected: on a machine with CUDA, ``check`` fails it (CPU vs CUDA) and ``run --device cuda`` marks its
trials invalid ("device: on cuda the evaluation-mode logits differ from the CPU's"); without CUDA it passes
everything, so it is tested by a CUDA-marked test only (tests/test_adversarial.py).
"""
from __future__ import annotations

import math

from harness import Component, Variant, hookimpl
from variants.attention import AnnotatedAttention  # the baseline's attention; only its GPU scale is changed

NAME = "evade_scale_on_gpu"
EXPECT_CHECK = "pass"  # on the CPU
EXPECT_REASON = "scores / d_model on CUDA, / sqrt(d_k) on the CPU"


class GpuScaleAttention(AnnotatedAttention):
    """The baseline's attention, its scores divided by d_model on CUDA tensors (the fault).
    Shape: query (B, Tq, D), key/value (B, Tk, D) -> (B, Tq, D)."""

    def attention(self, query, key, value, mask):
        if query.is_cuda:  # FAULT
            query = query * (math.sqrt(self.d_k) / (self.h * self.d_k))  # scores / d_model
        return super().attention(query, key, value, mask)


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", GpuScaleAttention, "multi-head attention", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME}, summary="baseline (another attention scale on CUDA)",
                    source="adversarial test plugin")]
