"""Adversarial plugin: a "no positions" ablation that still has positions, inside attention.

Fault: the author started from the RoPE component to answer note 004's question "why encode positions
at all?", took the additive encoding out (the embeddings are x * sqrt(d_model), as the formula says)
and left the rotation of q and k in every self-attention. The embedding side matches the formula
``no_positions`` exactly, so a check of the embeddings alone passes; trained against the baseline it
would copy as well as a model with positions, and the study would conclude that positions do not matter.

Expected: ``check`` fails the component: its self-attention scores change with position although the
formula adds nothing inside attention.
"""
from __future__ import annotations

from harness import Component, Variant, hookimpl
from variants.positional import RotaryPositional  # x * sqrt(D) on the embeddings; the rotation is the fault

NAME = "adv_no_positions_rotates"
EXPECT_CHECK = "fail"
EXPECT_REASON = "inside self-attention: scores q_rot k_rot^T (unchanged)"


class StillRotatingNoPositional(RotaryPositional):
    """dropout(x * sqrt(D)) on the embeddings (as declared), q and k still rotated by position (the fault)."""


@hookimpl
def harness_add_components():
    return [Component(NAME, "positional", StillRotatingNoPositional, "x*sqrt(d_model), dropout; no positions anywhere",
                      "adversarial test plugin",
                      differs="no positional information: the sinusoidal PE left out, nothing inside attention",
                      reference="no_positions")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"positional": NAME}, summary="baseline without positions (it says)",
                    source="adversarial test plugin")]
