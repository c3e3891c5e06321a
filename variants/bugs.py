"""Faithful reproductions of bugs found in the study notes (docs/seeds.md), kept on purpose.

They are marked ``buggy``: never part of ``--variants all`` or a glob (unless the glob starts
with ``bug``), selectable by exact name, and ``harness check`` must flag every one of them.

* mask ``bug_discarded_fill`` (note 001): ``scores.masked_fill(mask == 0, -1e9)`` whose result
  is thrown away -- the padding and causal masks silently never reach the softmax.
* mask ``bug_uint8_invert`` (note 001's ``.type(torch.uint8)`` masks): a uint8 keep-mask turned
  into a block-mask with ``~mask``; on uint8 ``~`` is bitwise (1 -> 254, 0 -> 255), so every
  position is blocked and attention becomes uniform, future tokens included.
* attention ``bug_unexpanded_mask`` (note 001): d2l folded heads (B*H, L, L) with ``bmm``, the
  mask passed as (B, X, L) without repeating it per head; crashes with "The size of tensor a
  (B) must match the size of tensor b (B*H)" (the note's recorded error) unless B == 1.
* attention ``bug_kv_query_len`` (note 002): K and V reshaped with the query's length; crashes
  in cross-attention whenever source and target lengths differ.
* feed_forward ``bug_narrow_ffn`` (note 002): the layers build their FFN as ``MLP(args.dim, args.dim)``,
  so the inner width is d_model instead of the config's d_ff (4x narrower at the paper's sizes); it
  computes an FFN, only a smaller one than the config asks for, and answers note 001's "why is d_ff so
  large?" by what it costs.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from harness import Component, Variant, hookimpl

from .attention import D2LAttention, HappyLLMAttention
from .mask import BoolMask


class DiscardedFillMask(BoolMask):
    """Note 001: the out-of-place ``masked_fill`` whose result is discarded."""

    def apply(self, scores, mask):
        scores.masked_fill(mask == 0, -1e9)  # BUG (faithful): result discarded
        return scores


class Uint8InvertMask(BoolMask):
    """uint8 keep-masks (note 001) inverted with ``~`` (bitwise on uint8): everything blocked."""

    def src_mask(self, src, pad):
        return super().src_mask(src, pad).to(torch.uint8)

    def tgt_mask(self, tgt, pad):
        return super().tgt_mask(tgt, pad).to(torch.uint8)

    def prefix_mask(self, ids, pad, prefix):
        return super().prefix_mask(ids, pad, prefix).to(torch.uint8)

    def apply(self, scores, mask):
        blocked = ~mask  # BUG (faithful pattern): 1 -> 254, 0 -> 255, all non-zero
        return scores.masked_fill(blocked.bool(), -1e9)


class UnexpandedMaskAttention(D2LAttention):
    """Note 001's ``bmm`` attention: 3-D masks (B, X, L) applied to (B*H, Tq, Tk) scores."""

    def dot_product_attention(self, queries, keys, values, mask):
        scores = torch.bmm(queries, keys.transpose(1, 2)) / math.sqrt(self.d_k)  # (B*H, Tq, Tk)
        if mask is not None:
            scores = self.apply_mask(scores, mask[:, 0])  # BUG (faithful): mask not repeated per head
        return torch.bmm(self.dropout(scores.softmax(dim=-1)), values)


class KVQueryLenAttention(HappyLLMAttention):
    """Note 002's happy-llm attention with K/V reshaped by the query's length."""

    def forward(self, q, k, v, mask=None):
        seqlen = q.size(1)
        xq = self.split(self.wq(q), seqlen)
        xk = self.split(self.wk(k), seqlen)  # BUG (faithful): should be k.size(1)
        xv = self.split(self.wv(v), seqlen)  # BUG (faithful): should be v.size(1)
        scores = torch.matmul(xq, xk.transpose(2, 3)) / math.sqrt(self.d_k)
        if mask is not None:
            scores = self.apply_mask(scores, mask)
        scores = torch.softmax(scores.float(), dim=-1).type_as(xq)
        out = torch.matmul(self.dropout(scores), xv).transpose(1, 2).contiguous().view(q.size(0), seqlen, -1)
        return self.resid_dropout(self.wo(out))


class NarrowFeedForward(nn.Module):
    """Note 002's ``MLP(dim, dim)``: w_2(dropout(relu(w_1(x)))) with inner width d_model, not d_ff.

    Shape: (B, L, D) -> (B, L, D); ``w_1`` (D, D), ``w_2`` (D, D) where the slot's layout is (d_ff, D), (D, d_ff).
    """

    def __init__(self, ctx):
        super().__init__()
        d = ctx.cfg.d_model
        self.w_1 = ctx.linear(d, d)  # BUG (faithful): MLP(args.dim, args.dim), hidden width d_model
        self.w_2 = ctx.linear(d, d)
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_2(self.dropout(torch.relu(self.w_1(x))))


@hookimpl
def harness_add_components():
    return [
        Component("bug_discarded_fill", "mask", lambda ctx: DiscardedFillMask(),
                  "BUG: masked_fill result discarded, mask never applied", "note 001", buggy=True),
        Component("bug_uint8_invert", "mask", lambda ctx: Uint8InvertMask(),
                  "BUG: uint8 mask inverted with ~ blocks every position", "note 001 (uint8 masks)", buggy=True),
        Component("bug_unexpanded_mask", "attention", UnexpandedMaskAttention,
                  "BUG: folded-head bmm attention with masks not repeated per head", "note 001", buggy=True),
        Component("bug_kv_query_len", "attention", KVQueryLenAttention,
                  "BUG: K/V reshaped with the query's length", "note 002", buggy=True),
        Component("bug_narrow_ffn", "feed_forward", NarrowFeedForward,
                  "BUG: FFN built as MLP(dim, dim): inner width d_model instead of d_ff", "note 002", buggy=True),
    ]


@hookimpl
def harness_add_variants():
    return [
        Variant("bug_001_discarded_mask", {"mask": "bug_discarded_fill"}, buggy=True,
                summary="note 001's discarded masked_fill: no mask reaches the softmax", source="note 001"),
        Variant("bug_001_uint8_invert", {"mask": "bug_uint8_invert"}, buggy=True,
                summary="uint8 keep-mask inverted with ~: every position blocked", source="note 001"),
        Variant("bug_001_unexpanded_mask", {"attention": "bug_unexpanded_mask"}, buggy=True,
                summary="note 001's bmm attention with masks not repeated per head: crashes",
                source="note 001"),
        Variant("bug_002_kv_query_len", {"attention": "bug_kv_query_len", "projections": "bias_free"},
                buggy=True, summary="note 002's K/V reshape with the query length: crashes when S != T",
                source="note 002"),
        Variant("bug_002_narrow_ffn", {"feed_forward": "bug_narrow_ffn"}, buggy=True,
                summary="note 002's MLP(dim, dim): an FFN of inner width d_model instead of d_ff (the baseline "
                        "otherwise)", source="note 002"),
    ]
