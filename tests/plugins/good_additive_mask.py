"""Correct plugin: an additive 0 / -inf mask written from scratch, with its fully-masked row declared.

Convention: float masks added to the scores, 0 = attend, -inf = blocked.
``src_mask(src (B, S), pad)`` -> (B, 1, 1, S): -inf at padded source keys.
``tgt_mask(tgt (B, T), pad)`` -> (B, 1, T, T): -inf at padded target keys and above the diagonal
(``torch.full((T, T), -inf).triu(1)``, i.e. ``nn.Transformer.generate_square_subsequent_mask``).
``apply(scores, mask)`` = ``scores + mask`` (any float dtype: the mask is cast to the scores' dtype).

Fully masked row (a source made only of padding): softmax of a row of -inf is NaN. Declared with
``fully_masked_row="nan"``. No such row occurs in the copy task or the check batch (every row has
at least one real token, and padded *query* rows are never blocked, only keys).

The ``fully_masked_row=`` keyword is the declaration API being built; on a harness whose
``Component`` does not accept it the plugin registers without it (``TypeError`` fallback).

Expected: ``check --variants good_additive_mask`` exits 0 with no flags (with the declaration API).
"""
from __future__ import annotations

import torch

from harness import Component, Variant, hookimpl

NAME = "good_additive_mask"
EXPECT_CHECK = "pass"
EXPECT_REASON = ""


class AdditiveMask:
    """0 / -inf float masks added to the attention scores."""

    def src_mask(self, src: torch.Tensor, pad: int) -> torch.Tensor:
        blocked = (src == pad)[:, None, None, :]  # (B, 1, 1, S)
        return torch.zeros(blocked.shape, device=src.device).masked_fill(blocked, float("-inf"))

    def tgt_mask(self, tgt: torch.Tensor, pad: int) -> torch.Tensor:
        t = tgt.size(1)
        future = torch.full((t, t), float("-inf"), device=tgt.device).triu(diagonal=1)  # (T, T)
        return self.src_mask(tgt, pad) + future  # (B, 1, T, T)

    def apply(self, scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return scores + mask.to(scores.dtype)


def _component() -> Component:
    args = (NAME, "mask", lambda ctx: AdditiveMask(), "additive 0/-inf mask; fully masked row -> NaN",
            "PyTorch float masks (test plugin)")
    try:
        return Component(*args, fully_masked_row="nan")
    except TypeError:  # a harness without the declaration API
        return Component(*args)


@hookimpl
def harness_add_components():
    return [_component()]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"mask": NAME}, summary="baseline with a from-scratch additive mask",
                    source="PyTorch float masks (test plugin)")]
