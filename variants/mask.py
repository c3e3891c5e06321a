"""Slot ``mask``: how masks are made from token ids and applied to attention scores.

Masks are made once per batch by the model and passed to every attention module; shapes
broadcast against scores (B, H, Tq, Tk) (the ``d2l`` attention folds the head dimension).

* ``bool`` -- keep-mask, True = attend: ``src_mask`` (B, 1, 1, S) = src != pad, ``tgt_mask``
  (B, 1, T, T) = (tgt != pad) & lower-triangular; applied as ``scores.masked_fill(mask == 0,
  -1e9)`` (Annotated Transformer ``attention``/``subsequent_mask``; notes 000, 004).
  Fully masked row: every score is -1e9, so the softmax is *uniform* over all keys (finite).
* ``additive`` -- float mask of 0 (attend) / -inf (blocked), same shapes, applied as
  ``scores + mask`` (happy-llm's causal buffer, note 002; ``generate_square_subsequent_mask``).
  Fully masked row: softmax of all -inf is *NaN*. No such row occurs in the copy task (every
  sequence starts with the start symbol, so key 0 is always real), and the probes of
  ``harness check`` report the NaN explicitly.
* ``valid_lens`` -- d2l §10.3 ``masked_softmax``: lengths instead of matrices. ``src_mask``
  (B, 1, 1, 1) = number of non-pad tokens (right padding assumed), ``tgt_mask`` (1, 1, T, 1) =
  1..T (d2l's ``dec_valid_lens``: causal only); applied by filling key positions >= length
  with -1e6. Fully masked row (length 0): uniform. Differs from ``bool`` only at padded query
  positions, which never reach the loss.

Every component: ``src_mask(src (B, S), pad)``, ``tgt_mask(tgt (B, T), pad)``,
``apply(scores (..., Tq, Tk), mask) -> scores``; and, for the ``prefix_lm`` architecture,
``prefix_mask(ids (B, L), pad, prefix (B,))``: key j visible to query i when not padding and j < prefix or
j <= i (Raffel et al. 2020 §3.2.1; :mod:`harness.decoder_only`).
"""
from __future__ import annotations

import torch

from harness import Component, hookimpl
from harness.config import WINDOW_DEFAULT
from harness.decoder_only import prefix_keep


def causal_keep(t: int, device) -> torch.Tensor:
    """(T, T) bool, True on and below the diagonal (Annotated ``subsequent_mask`` == 0 inverted)."""
    return torch.ones(t, t, dtype=torch.bool, device=device).tril()


class BoolMask:
    """Keep-mask convention, fill -1e9 (Annotated Transformer)."""

    fill = -1e9

    def src_mask(self, src, pad):
        return (src != pad)[:, None, None, :]  # (B, 1, 1, S)

    def tgt_mask(self, tgt, pad):
        return (tgt != pad)[:, None, None, :] & causal_keep(tgt.size(1), tgt.device)  # (B, 1, T, T)

    def prefix_mask(self, ids, pad, prefix):
        """Prefix LM (B, 1, L, L): key j kept when not padding and j < prefix_b or j <= i."""
        return prefix_keep(ids, pad, prefix)

    def apply(self, scores, mask):
        return scores.masked_fill(mask == 0, self.fill)


class SlidingWindowMask(BoolMask):
    """Sliding-window causal attention (Mistral, Jiang et al. 2023; Longformer's local attention, one-sided):
    the target mask keeps key j for query i when i - w < j <= i (w keys, itself included; HF Mistral's
    ``j > i - sliding_window``), w = ``ModelConfig.sliding_window()``; the source mask is padding only.
    Keep-mask convention, fill -1e9. Shape: ``tgt_mask`` (B, 1, T, T), ``src_mask`` (B, 1, 1, S)."""

    def __init__(self, window: int):
        self.window = window

    def tgt_mask(self, tgt, pad):
        t = tgt.size(1)
        i = torch.arange(t, device=tgt.device)[:, None]
        j = torch.arange(t, device=tgt.device)[None, :]
        return (tgt != pad)[:, None, None, :] & (j <= i) & (i - j < self.window)  # (B, 1, T, T)

    def prefix_mask(self, ids, pad, prefix):
        """Prefix LM (B, 1, L, L): the whole prefix is kept; after it, the window (i - w < j <= i)."""
        t = ids.size(1)
        i = torch.arange(t, device=ids.device)[:, None]
        j = torch.arange(t, device=ids.device)[None, :]
        window = (j <= i) & (i - j < self.window)
        return prefix_keep(ids, pad, prefix) & (window | (j < prefix[:, None, None]))[:, None]


class AdditiveMask:
    """0 / -inf float mask added to the scores (happy-llm, PyTorch's float masks)."""

    def src_mask(self, src, pad):
        m = torch.zeros(src.shape, device=src.device).masked_fill(src == pad, float("-inf"))
        return m[:, None, None, :]  # (B, 1, 1, S)

    def tgt_mask(self, tgt, pad):
        t = tgt.size(1)
        causal = torch.full((t, t), float("-inf"), device=tgt.device).triu(diagonal=1)  # (T, T)
        return self.src_mask(tgt, pad) + causal  # (B, 1, T, T)

    def prefix_mask(self, ids, pad, prefix):
        """Prefix LM (B, 1, L, L): 0 where :func:`prefix_keep` keeps, -inf elsewhere."""
        keep = prefix_keep(ids, pad, prefix)
        return torch.zeros(keep.shape, device=ids.device).masked_fill(~keep, float("-inf"))

    def apply(self, scores, mask):
        return scores + mask


class ValidLensMask:
    """d2l ``masked_softmax`` convention: valid lengths, fill -1e6."""

    fill = -1e6

    def src_mask(self, src, pad):
        return (src != pad).sum(-1)[:, None, None, None]  # (B, 1, 1, 1)

    def tgt_mask(self, tgt, pad):
        t = tgt.size(1)
        return torch.arange(1, t + 1, device=tgt.device)[None, None, :, None]  # (1, 1, T, 1)

    def prefix_mask(self, ids, pad, prefix):
        """Prefix LM as valid lengths (B, 1, L, 1): query i sees keys j < max(prefix_b, i + 1) (padding comes
        last in a packed sequence, so no real query's length reaches it)."""
        i = torch.arange(1, ids.size(1) + 1, device=ids.device)
        return torch.maximum(prefix[:, None], i[None, :])[:, None, :, None]

    def apply(self, scores, valid_lens):
        keep = torch.arange(scores.size(-1), device=scores.device) < valid_lens  # (..., Tq|1, Tk)
        return scores.masked_fill(~keep, self.fill)


@hookimpl
def harness_add_components():
    return [
        Component("bool", "mask", lambda ctx: BoolMask(),
                  "bool keep-mask, masked_fill(mask == 0, -1e9); fully masked row -> uniform",
                  "Annotated Transformer (notes 000, 004)", fully_masked_row="uniform", default=True),
        Component("sliding_window", "mask", lambda ctx: SlidingWindowMask(ctx.cfg.sliding_window()),
                  f"causal within a window of w keys (model.window, default {WINDOW_DEFAULT}), bool keep-mask",
                  "Mistral (Jiang et al. 2023); Longformer local attention",
                  differs="sliding-window causal attention: query i attends to i - w < j <= i only, not to every "
                          "earlier key (Mistral, Jiang et al. 2023)", reference="causal_window"),
        Component("additive", "mask", lambda ctx: AdditiveMask(),
                  "float 0/-inf added to scores; fully masked row -> NaN", "happy-llm (note 002)",
                  fully_masked_row="nan"),
        Component("valid_lens", "mask", lambda ctx: ValidLensMask(),
                  "valid lengths, fill -1e6 (d2l masked_softmax); fully masked row -> uniform",
                  "d2l §10.3 (note 003)", fully_masked_row="uniform"),
    ]
