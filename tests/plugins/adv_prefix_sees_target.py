"""Adversarial: a prefix-LM mask whose source positions also see the target (the prefix made bidirectional over
the whole packed sequence for source queries). Its ``tgt_mask`` is the bool causal mask, so encoder-decoder and
decoder-only models using it are right; only in ``prefix_lm`` does a source position read target tokens, and
every target position then reads later target tokens through the source's keys and values. ``check`` must fail it
with the fault named ("a source position sees the target") and ``run`` must mark its trials invalid.

Variant ``adv_prefix_sees_target``: architecture ``prefix_lm``, mask ``prefix_sees_target``."""
from __future__ import annotations

import torch

from harness import Component, Variant, hookimpl
from variants.mask import BoolMask


class PrefixSeesTarget(BoolMask):
    """Bool keep-mask; ``prefix_mask`` keeps every non-pad key for source queries (i < prefix)."""

    def prefix_mask(self, ids, pad, prefix):
        keep = super().prefix_mask(ids, pad, prefix)  # (B, 1, L, L)
        source_query = torch.arange(ids.size(1), device=ids.device)[None, :] < prefix[:, None]  # (B, L)
        return keep | ((ids != pad)[:, None, None, :] & source_query[:, None, :, None])


@hookimpl
def harness_add_components():
    return [Component("prefix_sees_target", "mask", lambda ctx: PrefixSeesTarget(),
                      "prefix-LM mask whose source queries see every key, the target's included", "adversarial test")]


@hookimpl
def harness_add_variants():
    return [Variant("adv_prefix_sees_target", {"architecture": "prefix_lm", "mask": "prefix_sees_target"},
                    summary="prefix LM whose source positions see the target", source="adversarial test")]
