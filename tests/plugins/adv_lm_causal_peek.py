"""Adversarial: a decoder-only model whose causal mask lets position t see t + 1 (``j <= i + 1``), the off-by-one
a hand-written ``triu(diagonal=2)`` makes. In the packed sequence [source, start, target] the last source token
then sees the start symbol and every target position the next target token: the label itself. ``check`` must fail
it with the fault named ("it sees the future") and ``run`` must mark its trials invalid.

Variant ``adv_lm_causal_peek``: architecture ``decoder_only``, mask ``peek_next``."""
from __future__ import annotations

import torch

from harness import Component, Variant, hookimpl
from variants.mask import BoolMask


class PeekNext(BoolMask):
    """Bool keep-mask whose causal part keeps j <= i + 1."""

    def tgt_mask(self, tgt, pad):
        t = tgt.size(1)
        peek = torch.ones(t, t, dtype=torch.bool, device=tgt.device).tril(diagonal=1)
        return (tgt != pad)[:, None, None, :] & peek  # (B, 1, T, T)


@hookimpl
def harness_add_components():
    return [Component("peek_next", "mask", lambda ctx: PeekNext(),
                      "causal mask off by one: position t sees t + 1", "adversarial test")]


@hookimpl
def harness_add_variants():
    return [Variant("adv_lm_causal_peek", {"architecture": "decoder_only", "mask": "peek_next"},
                    summary="decoder-only model whose causal mask lets t see t + 1", source="adversarial test")]
