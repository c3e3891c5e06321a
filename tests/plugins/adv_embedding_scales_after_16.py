"""Adversarial plugin: target embeddings that are the lookup table's only up to position 15.

Fault: from target position 16 on, the looked-up vectors are multiplied by 1.5 (a "length-aware" rescale).
The embedding contract compares lookups on the check batch (10 target positions), so the component passed as
``nn.Embedding`` + ``nn.Linear``, and with every whole-model comparison also stopping at 10 positions the
variant was classed the baseline's function, while the g2p task's words (up to 24 tokens) and the quick
preset's copy rows (up to 21) train another function. Deliberate check-gaming; not declared buggy.

Expected: ``check`` fails: "tgt(ids) is not a per-token lookup of tgt.weight: right up to position 15, wrong from
position 16 on" (the embedding contract's batch now has 2 rows as long as ``max_len``), and beside the baseline
"differs unexpectedly (expected equivalent)" (so has every whole-model comparison).
"""
from __future__ import annotations

from harness import Component, Variant, hookimpl
from variants.embedding import SeparateEmbeddings  # the paper's embeddings; only the target lookup is changed

NAME = "adv_embedding_scales_after_16"
EXPECT_CHECK = "fail"
EXPECT_REASON = "target embeddings x 1.5 from position 16 on"


class ScalesAfter16(SeparateEmbeddings):
    """Separate tables and generator; target vectors x 1.5 from position 16 on (the fault). ids (B, T) -> (B, T, D)."""

    def tgt(self, ids):
        x = self.tgt_lut(ids)
        if x.size(1) > 16:  # FAULT
            x = x.clone()
            x[:, 16:] = x[:, 16:] * 1.5
        return x


@hookimpl
def harness_add_components():
    return [Component(NAME, "embedding", ScalesAfter16, "separate source/target tables and generator",
                      "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"embedding": NAME}, summary="baseline (target embeddings x 1.5 from position 16)",
                    source="adversarial test plugin")]
