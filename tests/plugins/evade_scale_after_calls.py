"""Evasion plugin: attention that switches its scale after its first 100 training-mode calls (a time bomb).

Fault: each attention module counts its training-mode forward calls (a plain attribute, neither parameter nor
buffer) and from then on divides the scores by d_model instead of sqrt(d_k), in training and evaluation alike.
Every check builds fresh components and calls them a few times, the training = evaluation item too; the probes
look for leaks (there are none); the held-out future-leak check repeats a forward at each evaluation to catch
state kept between forwards, but nothing changes between its two evaluation-mode passes. All of them see the
paper's attention, while the trial trains its first 100 steps with one function and the rest, and is scored,
with another. Real code does this by accident when it keeps a cache or a step counter in a module.

Expected: ``check`` passes it (no component there reaches 100 training-mode calls); ``run`` marks every trial
invalid after training, for this reason alone: "drift: after training the model's logits differ from those of a fresh build holding its trained
parameters".
"""
from __future__ import annotations

import math

from harness import Component, Variant, hookimpl
from variants.attention import AnnotatedAttention  # the baseline's attention; only its scale drifts

NAME = "evade_scale_after_calls"
EXPECT_CHECK = "pass"
EXPECT_REASON = "scores / d_model after 100 training-mode calls, / sqrt(d_k) before"
CALLS = 100


class DriftingAttention(AnnotatedAttention):
    """The baseline's attention; after :data:`CALLS` training-mode calls its scores are divided by d_model (the
    fault). Shape: query (B, Tq, D), key/value (B, Tk, D) -> (B, Tq, D)."""

    def attention(self, query, key, value, mask):
        self.calls = getattr(self, "calls", 0) + int(self.training)
        if self.calls > CALLS:  # FAULT
            query = query * (math.sqrt(self.d_k) / (self.h * self.d_k))  # scores / d_model
        return super().attention(query, key, value, mask)


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", DriftingAttention, "multi-head attention", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME}, summary="baseline (its attention's scale drifts after 100 training steps)",
                    source="adversarial test plugin")]
