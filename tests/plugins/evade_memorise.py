"""Evasive plugin: an embedding that memorises held-out answers between forwards.

Fault: in eval mode ``tgt(ids)`` writes every target row it is shown into a book (prefix ->
next token), and ``logits(x)`` for one decoding step (input (B, D), the shape of step-by-step
decoding) adds +30 to the book's next token when the current prefix is in it. Every forward is
causal and every single forward is honest about its input; but a sequence scored a second time is
answered from memory, not from the weights (held-out sets re-used across evaluations, or the
short sequences every random draw repeats). Weights, masks and training are the baseline's.
Deliberate cheating, documented as such; not declared buggy.

Expected: ``check`` passes (``EXPECT_CHECK``); ``run`` marks the variant invalid through the
state half of the evaluation's future-leak check: the prefix-only logits of a held-out batch move
when the pass is repeated (``harness.tasks.base.future_leak``).
"""
from __future__ import annotations

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "evade_memorise"
EXPECT_CHECK = "pass"
EXPECT_REASON = "answers held-out sequences it has been shown before from a Python dict"


class MemorisingEmbeddings(nn.Module):
    """Separate tables and generator (canonical names as the built-in ``separate``) plus a book.

    ``src``/``tgt``: ids (B, L) -> (B, L, D); ``logits``: (B, T, D) -> (B, T, V) or (B, D) -> (B, V).
    """

    def __init__(self, ctx):
        super().__init__()
        v, d = ctx.cfg.vocab, ctx.cfg.d_model
        self.src_lut, self.tgt_lut, self.generator = nn.Embedding(v, d), nn.Embedding(v, d), nn.Linear(d, v)
        self.book: dict[tuple, int] = {}
        self.last: list[tuple] = []

    def src(self, ids):
        return self.src_lut(ids)

    def tgt(self, ids):
        if not self.training:
            rows = [tuple(r) for r in ids.tolist()]
            for r in rows:  # FAULT: remember what comes after every prefix shown
                for i in range(1, len(r)):
                    self.book[r[:i]] = r[i]
            self.last = rows
        return self.tgt_lut(ids)

    def logits(self, x):
        out = self.generator(x)
        if x.dim() == 2 and not self.training and len(self.last) == x.size(0):
            for b, r in enumerate(self.last):  # one decoding step: answer from memory when possible
                if r in self.book:
                    out[b, self.book[r]] += 30.0
        return out

    def canonical_state(self):
        return {"src.weight": self.src_lut.weight, "tgt.weight": self.tgt_lut.weight,
                "generator.weight": self.generator.weight, "generator.bias": self.generator.bias}

    def load_canonical_state(self, state):
        with torch.no_grad():
            for name, p in self.canonical_state().items():
                p.copy_(state[name])
        return []


@hookimpl
def harness_add_components():
    return [Component(NAME, "embedding", MemorisingEmbeddings, "separate tables + a book of seen answers",
                      "evasive test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"embedding": NAME}, summary="baseline whose embedding memorises held-out answers",
                    source="evasive test plugin")]
