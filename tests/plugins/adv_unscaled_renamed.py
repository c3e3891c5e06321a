"""Adversarial plugin: attention without the 1/sqrt(d_k) scale, its projections named as a newcomer names
them (``q``, ``k``, ``v``, ``o`` instead of the canonical ``w_q``, ``w_k``, ``w_v``, ``w_o``).

Fault: ``scores = Q K^T`` where Vaswani et al. 2017 §3.2.1 divide by sqrt(d_k). The renamed parameters
are the hiding place: comparisons that copy the canonical weights into the component cannot load them,
so a check that skipped what it cannot load would pass the variant. It must fail, and say why.

Expected: ``check`` fails with the layout named ("does not export the canonical layout"); the comparison
with nn.Transformer says which parameter has no counterpart there (no bare KeyError).
"""
from __future__ import annotations

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_unscaled_renamed"


class RenamedUnscaledAttention(nn.Module):
    """(query (B, Tq, D), key (B, Tk, D), value (B, Tk, D), mask) -> (B, Tq, D), with no score scale."""

    def __init__(self, ctx):
        super().__init__()
        d, self.h = ctx.cfg.d_model, ctx.cfg.h
        self.d_k = d // self.h
        self.q, self.k, self.v, self.o = (ctx.linear(d, d) for _ in range(4))
        self.masking = ctx.mask

    def forward(self, query, key, value, mask):
        b, tq = query.shape[:2]

        def split(x: torch.Tensor) -> torch.Tensor:  # (B, L, D) -> (B, h, L, d_k)
            return x.view(b, -1, self.h, self.d_k).transpose(1, 2)

        q, k, v = split(self.q(query)), split(self.k(key)), split(self.v(value))
        scores = self.masking.apply(q @ k.transpose(-2, -1), mask)  # the fault: no / sqrt(d_k)
        out = scores.softmax(-1) @ v
        return self.o(out.transpose(1, 2).reshape(b, tq, -1))


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", RenamedUnscaledAttention, summary="attention without the score scale",
                      source="a newcomer's notes")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME}, summary="unscaled attention, plain parameter names",
                    source="a newcomer's notes")]
