"""Adversarial plugin: a target embedding that adds the target length to every position.

Fault: ``tgt(ids)`` returns ``tgt_lut(ids) + len_lut(n)`` where ``n`` (B,) is the number of
non-pad tokens in the *whole* target row, broadcast to every position. Position t thereby knows
how many target tokens follow it -- information from the future that reaches the decoder through
the padding, not through attention, so the masks are irrelevant to it. A causal probe that
redraws the future tokens among non-pad ids, keeping pad positions pad, sees no change; one that
changes the *number* of pad tokens after position t (turns future pads into tokens or future
tokens into pads) does. In greedy decoding ``n`` is the length decoded so far, so training and
inference disagree as well. The length table is part of the canonical state (``tgt_length.weight``,
(max_len + 1, D)), so nothing about the layout hides it. Not declared buggy.

Expected: ``check`` fails with a causal leak through the padding: "decoder position p changed ...
when the target tokens after position p changed" (a probe that changes the padding of the future).
"""
from __future__ import annotations

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_length_embedding"
EXPECT_CHECK = "fail"
EXPECT_REASON = "target embedding encodes the number of non-pad target tokens: the future leaks through padding"


class LengthAwareEmbeddings(nn.Module):
    """Separate source/target tables and generator; the target lookup adds a length vector (the fault).

    ``src``: (B, S) -> (B, S, D); ``tgt``: (B, T) -> (B, T, D); ``logits``: (B, T, D) -> (B, T, V).
    Canonical: ``src.weight``, ``tgt.weight``, ``generator.weight``, ``generator.bias``,
    ``tgt_length.weight`` (max_len + 1, D).
    """

    def __init__(self, ctx):
        super().__init__()
        v, d = ctx.cfg.vocab, ctx.cfg.d_model
        self.pad = ctx.cfg.pad
        self.src_lut = nn.Embedding(v, d)
        self.tgt_lut = nn.Embedding(v, d)
        self.len_lut = nn.Embedding(ctx.cfg.max_len + 1, d)
        self.generator = nn.Linear(d, v)

    def src(self, ids):
        return self.src_lut(ids)

    def tgt(self, ids):
        n = (ids != self.pad).sum(dim=-1)  # (B,) FAULT: length of the whole row, future included
        return self.tgt_lut(ids) + self.len_lut(n)[:, None, :]  # (B, T, D)

    def logits(self, x):
        return self.generator(x)

    def canonical_state(self):
        return {"src.weight": self.src_lut.weight, "tgt.weight": self.tgt_lut.weight,
                "tgt_length.weight": self.len_lut.weight,
                "generator.weight": self.generator.weight, "generator.bias": self.generator.bias}

    def load_canonical_state(self, state):
        notes = []
        with torch.no_grad():
            for name, p in self.canonical_state().items():
                if name in state:
                    p.copy_(state[name])
                else:
                    notes.append(f"{name} missing; kept")
        return notes


@hookimpl
def harness_add_components():
    return [Component(NAME, "embedding", LengthAwareEmbeddings,
                      "separate tables and generator, target length embedding", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"embedding": NAME}, summary="baseline whose target embedding encodes the target length",
                    source="adversarial test plugin")]
