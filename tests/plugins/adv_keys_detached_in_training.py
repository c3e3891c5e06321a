"""Adversarial plugin: attention whose keys are cut from the gradient in training only.

Fault: in training mode ``k = w_k(key).detach()``: the forward is the paper's scaled dot-product
attention in both modes, but in training no gradient reaches ``w_k`` (nor, through the keys, the
layers below), so ``w_k`` never trains. Every gradient a check computes is taken in evaluation mode
(the model contract's "every parameter gets a gradient", check's pairs), where the keys are not
detached, so such a component used to pass ``check`` and be classed "same function" as the
baseline. Deliberate check-gaming; not declared buggy.

Expected: ``check`` fails on "training = evaluation (dropout 0)": the logits agree, the gradients
do not, and ``w_k`` "gets none in training"; ``run`` marks the variant invalid.
"""
from __future__ import annotations

from harness import Component, Variant, hookimpl
from variants.attention import AnnotatedAttention  # the baseline's attention; only its keys' gradient is cut

NAME = "adv_keys_detached_in_training"
EXPECT_CHECK = "fail"
EXPECT_REASON = "keys detached in training: same forward, w_k gets no gradient in training"


class DetachedKeysAttention(AnnotatedAttention):
    """The baseline's attention (Annotated Transformer, heads (B, H, L, d_k)) with the projected keys detached
    in training (the fault): the same forward, no gradient to ``w_k`` in training.
    Shape: query (B, Tq, D), key/value (B, Tk, D) -> (B, Tq, D).
    """

    def attention(self, query, key, value, mask):
        if self.training:
            key = key.detach()  # FAULT: no gradient to w_k in training
        return super().attention(query, key, value, mask)


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", DetachedKeysAttention,
                      "multi-head attention (keys detached in training)", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME}, summary="baseline with its keys detached in training",
                    source="adversarial test plugin")]
