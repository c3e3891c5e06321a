"""Adversarial plugin: attention that attends within blocks of 16 positions once a sequence is longer.

Fault: above 16 keys the queries are split into blocks of 16 and each block attends only to the keys of
its own block (say, a memory-saving rewrite tried on short sequences only). It is the paper's attention
for every length the attention contract and the probes fed before (at most 10 keys); it leaks nothing (a
block's causal mask is the slice of the real one), so no probe fails; and the g2p task's words (up to 24
tokens) and the gpu preset's 32-token rows would train another function than the class "same function"
says. Deliberate check-gaming; not declared buggy.

Expected: ``check`` (and the run gate, at the trial's max_len) fails the attention contract at the long
length: "self-attention vs scaled dot-product attention at length 32".
"""
from __future__ import annotations

import torch

from harness import Component, Variant, hookimpl
from variants.attention import AnnotatedAttention  # the baseline's attention; only long sequences change

NAME = "adv_attention_chunks_16"
EXPECT_CHECK = "fail"
EXPECT_REASON = "above 16 keys each block of 16 queries attends only to its own block of keys"
BLOCK = 16


class BlockAttention(AnnotatedAttention):
    """The baseline's attention (heads (B, H, L, d_k)); above :data:`BLOCK` keys, block-local (the fault).
    Shape: query (B, Tq, D), key/value (B, Tk, D) -> (B, Tq, D)."""

    def attention(self, query, key, value, mask):
        tq, tk = query.size(-2), key.size(-2)
        if tk <= BLOCK:
            return super().attention(query, key, value, mask)
        outs = []
        for start in range(0, tq, BLOCK):  # FAULT: each block of queries sees one block of keys
            rows = slice(start, start + BLOCK)
            cols = slice(start, start + BLOCK) if start < tk else slice(tk - BLOCK, tk)
            m = None if mask is None else mask[..., rows if mask.size(-2) > 1 else slice(None), cols]
            outs.append(super().attention(query[..., rows, :], key[..., cols, :], value[..., cols, :], m))
        return torch.cat(outs, dim=-2)


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", BlockAttention, "multi-head attention", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME}, summary="baseline (block-local attention above 16 keys)",
                    source="adversarial test plugin")]
