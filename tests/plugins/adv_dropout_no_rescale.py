"""Adversarial plugin: attention whose dropout forgets the 1 / (1 - p) rescale.

Fault: the attention weights are dropped with a hand-written Bernoulli mask and not rescaled, so in training
the expected attention output is (1 - p) times the evaluation one. Every comparison runs with dropout off
(evaluation mode, or dropout 0 in the training = evaluation item), where it is the paper's attention; at the
paper preset's dropout 0.1 it would train as another function than the class "same function" says, and the
model would be evaluated in a regime it never trained in. A real mistake of hand-written dropout.
Deliberate; not declared buggy.

Expected: ``check`` fails the attention contract's dropout item: "the mean training output is 0.50 x the
evaluation output" (tested at p = 0.5).
"""
from __future__ import annotations

import math

import torch

from harness import Component, Variant, hookimpl
from variants.attention import AnnotatedAttention  # the baseline's attention; only its dropout is hand-written

NAME = "adv_dropout_no_rescale"
EXPECT_CHECK = "fail"
EXPECT_REASON = "attention weights dropped without the 1 / (1 - p) rescale"


class NoRescaleDropoutAttention(AnnotatedAttention):
    """The baseline's scaled dot-product attention with the weights multiplied by a Bernoulli(1 - p) mask in
    training and never rescaled (the fault). Shape: query (B, Tq, D), key/value (B, Tk, D) -> (B, Tq, D)."""

    def attention(self, query, key, value, mask):
        scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(self.d_k)  # (B, H, Tq, Tk)
        scores = self.positions.bias(scores)
        if mask is not None:
            scores = self.apply_mask(scores, mask)
        p_attn = scores.softmax(dim=-1)
        if self.training and self.dropout.p > 0:  # FAULT: no division by 1 - p
            p_attn = p_attn * (torch.rand_like(p_attn) >= self.dropout.p)
        return torch.matmul(p_attn, value)


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", NoRescaleDropoutAttention, "multi-head attention", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME}, summary="baseline (hand-written attention dropout, no rescale)",
                    source="adversarial test plugin")]
