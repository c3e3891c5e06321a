"""Adversarial plugin: d2l-style folded-head attention whose mask is folded head-major.

Fault: heads are folded into the batch batch-major, index ``b * H + head`` (d2l's
``transpose_qkv``), but the mask is folded with ``mask.repeat(h, 1, 1)``, which is head-major:
index i gets the mask of batch element ``i % B``. d2l itself uses
``torch.repeat_interleave(valid_lens, repeats=num_heads, dim=0)`` for exactly this reason; using
``repeat`` is a common slip. Each (batch element, head) then gets *another* batch element's
padding mask: padded source keys are attended in some rows and real keys blocked in others. The
causal part is the same for every batch element, and a target's padded keys are always in the
future of its real queries (right padding), so the causal probes pass; with B = 1, or when every
row has the same padding, the bug is invisible. Not declared buggy.

Expected: ``check`` fails with a padding leak ("real target positions changed ... when the tokens
at padded source positions changed ... padding mask not applied") and the attention differing
from nn.MultiheadAttention (cross-attention).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_fold_mask_repeat"
EXPECT_CHECK = "fail"
EXPECT_REASON = "mask folded head-major (repeat) against batch-major heads: another row's padding mask"


def transpose_qkv(x: torch.Tensor, h: int) -> torch.Tensor:
    """(B, L, D) -> (B*H, L, d_k), batch-major (index b*H + head) as d2l §10.5."""
    x = x.reshape(x.size(0), x.size(1), h, -1).permute(0, 2, 1, 3)  # (B, H, L, d_k)
    return x.reshape(-1, x.size(2), x.size(3))  # (B*H, L, d_k)


def transpose_output(x: torch.Tensor, h: int) -> torch.Tensor:
    """(B*H, L, d_k) -> (B, L, D), the inverse of :func:`transpose_qkv`."""
    x = x.reshape(-1, h, x.size(1), x.size(2)).permute(0, 2, 1, 3)  # (B, L, H, d_k)
    return x.reshape(x.size(0), x.size(1), -1)  # (B, L, D)


class RepeatFoldedMaskAttention(nn.Module):
    """d2l ``MultiHeadAttention`` with ``bmm``; the (B, 1, X, Y) mask folded by ``repeat`` (the fault).

    Shape: queries (B, Tq, D), keys/values (B, Tk, D) -> (B, Tq, D).
    """

    def __init__(self, ctx):
        super().__init__()
        d = ctx.cfg.d_model
        self.h, self.d_k = ctx.cfg.h, d // ctx.cfg.h
        self.w_q, self.w_k, self.w_v, self.w_o = (ctx.linear(d, d) for _ in range(4))
        self.apply_mask = ctx.mask.apply
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def fold_mask(self, mask: torch.Tensor, b: int) -> torch.Tensor:
        m = mask.expand(b, *mask.shape[1:])[:, 0]  # (B, X, Y)
        return m.repeat(self.h, 1, 1)  # FAULT: head-major (H*B, X, Y); should be repeat_interleave(h, dim=0)

    def forward(self, queries, keys, values, mask=None):
        b = queries.size(0)
        q = transpose_qkv(self.w_q(queries), self.h)  # (B*H, Tq, d_k)
        k = transpose_qkv(self.w_k(keys), self.h)  # (B*H, Tk, d_k)
        v = transpose_qkv(self.w_v(values), self.h)  # (B*H, Tk, d_k)
        scores = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(self.d_k)  # (B*H, Tq, Tk)
        if mask is not None:
            scores = self.apply_mask(scores, self.fold_mask(mask, b))
        out = torch.bmm(self.dropout(scores.softmax(dim=-1)), v)  # (B*H, Tq, d_k)
        return self.w_o(transpose_output(out, self.h))  # (B, Tq, D)


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", RepeatFoldedMaskAttention,
                      "d2l folded-head attention, mask folded with repeat", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME}, summary="baseline with d2l attention folding the mask head-major",
                    source="adversarial test plugin")]
