"""Correct plugin: multi-head attention written from scratch in the d2l style (d2l §10.5).

Heads are folded into the batch (``transpose_qkv``: (B, L, D) -> (B*H, L, d_k), index b*H + head)
and the scores computed with ``torch.bmm``; the parameters are called ``W_q, W_k, W_v, W_o`` (d2l's
names) and mapped to the slot's canonical layout ``w_q, w_k, w_v, w_o`` (``.weight`` (D, D) and,
when the ``projections`` slot gives biases, ``.bias`` (D,)) by ``canonical_state`` /
``load_canonical_state``. Masks stay in the mask component's convention: the folded scores are
viewed as (B, H, Tq, Tk), given to ``ctx.mask.apply`` and folded back, so the mask is never
re-indexed by hand (the d2l slip of ``repeat`` vs ``repeat_interleave`` cannot happen). Dropout on
the attention weights (``nn.Dropout``, off in eval mode).

This is scaled dot-product multi-head attention (Vaswani et al. 2017 §3.2) and declares nothing:
it is held to the slot's reference and must pass.

Expected: ``check --variants good_d2l_attention`` exits 0 with no flags.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "good_d2l_attention"
EXPECT_CHECK = "pass"
EXPECT_REASON = ""

_NAMES = {"w_q": "W_q", "w_k": "W_k", "w_v": "W_v", "w_o": "W_o"}  # canonical -> own


def transpose_qkv(x: torch.Tensor, h: int) -> torch.Tensor:
    """(B, L, D) -> (B*H, L, d_k), batch-major (d2l §10.5 ``transpose_qkv``)."""
    x = x.reshape(x.size(0), x.size(1), h, -1)  # (B, L, H, d_k)
    x = x.permute(0, 2, 1, 3)  # (B, H, L, d_k)
    return x.reshape(-1, x.size(2), x.size(3))  # (B*H, L, d_k)


def transpose_output(x: torch.Tensor, h: int) -> torch.Tensor:
    """(B*H, L, d_k) -> (B, L, D), the inverse of :func:`transpose_qkv`."""
    x = x.reshape(-1, h, x.size(1), x.size(2))  # (B, H, L, d_k)
    x = x.permute(0, 2, 1, 3)  # (B, L, H, d_k)
    return x.reshape(x.size(0), x.size(1), -1)  # (B, L, D)


class D2LMultiHeadAttention(nn.Module):
    """d2l ``MultiHeadAttention`` with ``DotProductAttention`` inlined.

    Shape: queries (B, Tq, D), keys/values (B, Tk, D), mask from the mask component -> (B, Tq, D).
    """

    def __init__(self, ctx):
        super().__init__()
        d = ctx.cfg.d_model
        self.num_heads = ctx.cfg.h
        self.d_k = d // ctx.cfg.h
        self.W_q = ctx.linear(d, d)
        self.W_k = ctx.linear(d, d)
        self.W_v = ctx.linear(d, d)
        self.W_o = ctx.linear(d, d)
        self.apply_mask = ctx.mask.apply
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def masked_scores(self, scores: torch.Tensor, mask, b: int) -> torch.Tensor:
        """Apply the mask to folded scores (B*H, Tq, Tk) through a (B, H, Tq, Tk) view."""
        tq, tk = scores.shape[1:]
        return self.apply_mask(scores.reshape(b, self.num_heads, tq, tk), mask).reshape(b * self.num_heads, tq, tk)

    def forward(self, queries, keys, values, mask=None):
        b = queries.size(0)
        q = transpose_qkv(self.W_q(queries), self.num_heads)  # (B*H, Tq, d_k)
        k = transpose_qkv(self.W_k(keys), self.num_heads)  # (B*H, Tk, d_k)
        v = transpose_qkv(self.W_v(values), self.num_heads)  # (B*H, Tk, d_k)
        scores = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(self.d_k)  # (B*H, Tq, Tk)
        if mask is not None:
            scores = self.masked_scores(scores, mask, b)
        out = torch.bmm(self.dropout(torch.softmax(scores, dim=-1)), v)  # (B*H, Tq, d_k)
        return self.W_o(transpose_output(out, self.num_heads))  # (B, Tq, D)

    def canonical_state(self) -> dict[str, torch.Tensor]:
        out = {}
        for canon, own in _NAMES.items():
            lin = getattr(self, own)
            out[f"{canon}.weight"] = lin.weight
            if lin.bias is not None:
                out[f"{canon}.bias"] = lin.bias
        return out

    def load_canonical_state(self, state: dict[str, torch.Tensor]) -> list[str]:
        notes = []
        with torch.no_grad():
            for canon, own in _NAMES.items():
                lin = getattr(self, own)
                lin.weight.copy_(state[f"{canon}.weight"])
                bias = state.get(f"{canon}.bias")
                if lin.bias is not None:
                    lin.bias.copy_(bias if bias is not None else torch.zeros_like(lin.bias))
                elif bias is not None and bool(bias.abs().max() > 0):
                    notes.append(f"{canon}.bias is non-zero but this component has no bias")
        return notes


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", D2LMultiHeadAttention,
                      "d2l-style: W_q/W_k/W_v/W_o, heads folded into the batch, bmm", "d2l §10.5 (test plugin)")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME}, summary="baseline with a from-scratch d2l-style attention",
                    source="d2l §10.5 (test plugin)")]
