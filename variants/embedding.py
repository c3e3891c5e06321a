"""Slot ``embedding``: source embedding, target embedding and the pre-softmax projection.

* ``separate``: three matrices -- the Annotated Transformer's ``make_model`` (two
  ``Embeddings`` and a ``Generator``); every study note.
* ``shared``: one (V, D) matrix for all three uses, the generator computing x @ W^T + b
  -- Vaswani et al. 2017 §3.4, Press & Wolf 2017. Removes exactly 2*V*D parameters.

Canonical parameters: ``src.weight`` (V, D), ``tgt.weight`` (V, D), ``generator.weight``
(V, D), ``generator.bias`` (V,). ``shared`` exports its one matrix under all three names and
imports from ``tgt.weight`` (noting a lossy import when the three differ).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from harness import Component, hookimpl


class SeparateEmbeddings(nn.Module):
    """Separate source/target lookup tables and generator ``nn.Linear(D, V)``.

    ``src``/``tgt``: ids (B, L) -> (B, L, D); ``logits``: (B, T, D) -> (B, T, V).
    """

    def __init__(self, ctx):
        super().__init__()
        v, d = ctx.cfg.vocab, ctx.cfg.d_model
        self.src_lut = nn.Embedding(v, d)
        self.tgt_lut = nn.Embedding(v, d)
        self.generator = nn.Linear(d, v)

    def src(self, ids):
        return self.src_lut(ids)

    def tgt(self, ids):
        return self.tgt_lut(ids)

    def logits(self, x):
        return self.generator(x)

    def canonical_state(self):
        return {"src.weight": self.src_lut.weight, "tgt.weight": self.tgt_lut.weight,
                "generator.weight": self.generator.weight, "generator.bias": self.generator.bias}

    def load_canonical_state(self, state):
        with torch.no_grad():
            for name, p in self.canonical_state().items():
                p.copy_(state[name])
        return []


class SharedEmbeddings(nn.Module):
    """One matrix W (V, D) used as source table, target table and generator weight (§3.4).

    ``src``/``tgt``: ids (B, L) -> W[ids] (B, L, D); ``logits``: x (B, T, D) -> x W^T + b (B, T, V).
    """

    def __init__(self, ctx):
        super().__init__()
        v, d = ctx.cfg.vocab, ctx.cfg.d_model
        self.weight = nn.Parameter(torch.empty(v, d))
        self.bias = nn.Parameter(torch.zeros(v))
        nn.init.normal_(self.weight)

    def src(self, ids):
        return F.embedding(ids, self.weight)

    def tgt(self, ids):
        return F.embedding(ids, self.weight)

    def logits(self, x):
        return F.linear(x, self.weight, self.bias)

    def canonical_state(self):
        return {"src.weight": self.weight, "tgt.weight": self.weight,
                "generator.weight": self.weight, "generator.bias": self.bias}

    def load_canonical_state(self, state):
        notes = []
        w = state["tgt.weight"]
        for other in ("src.weight", "generator.weight"):
            if other in state and not torch.equal(state[other].to(w.device), w):
                notes.append(f"{other} differs from tgt.weight; shared embedding keeps tgt.weight")
        with torch.no_grad():
            self.weight.copy_(w)
            self.bias.copy_(state["generator.bias"])
        return notes


@hookimpl
def harness_add_components():
    return [
        Component("separate", "embedding", SeparateEmbeddings,
                  "source table, target table and generator each with their own weight",
                  "Annotated Transformer make_model; all study notes", default=True),
        Component("shared", "embedding", SharedEmbeddings,
                  "one (V, D) matrix for source, target and generator (2*V*D fewer parameters)",
                  "Vaswani et al. 2017 §3.4; Press & Wolf 2017"),
    ]
