"""Correct plugin: multi-head attention written from scratch in the Annotated Transformer style.

``MultiHeadedAttention`` with ``linears = clones(Linear(D, D), 4)`` and a module-level
``attention(query, key, value, mask, dropout)`` function; heads as (B, H, L, d_k) via
``view(B, -1, h, d_k).transpose(1, 2)``; ``torch.matmul``. The Annotated code's
``mask.unsqueeze(1)`` is left out because the harness's masks already carry the head dimension,
and ``masked_fill(mask == 0, -1e9)`` is replaced by the mask component's ``apply`` (so it works with
any mask convention). ``canonical_state`` maps ``linears.0..3`` to ``w_q, w_k, w_v, w_o``
(``.weight`` and, when present, ``.bias``).

Scaled dot-product multi-head attention (Vaswani et al. 2017 §3.2); declares nothing and must pass.

Expected: ``check --variants good_annotated_attention`` exits 0 with no flags.
"""
from __future__ import annotations

import copy
import math

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "good_annotated_attention"
EXPECT_CHECK = "pass"
EXPECT_REASON = ""

_CANONICAL = ("w_q", "w_k", "w_v", "w_o")


def clones(module: nn.Module, n: int) -> nn.ModuleList:
    """N identical, independent copies (Annotated ``clones``)."""
    return nn.ModuleList([copy.deepcopy(module) for _ in range(n)])


def attention(query, key, value, mask=None, dropout=None, apply_mask=None):
    """Scaled dot-product attention on (B, H, L, d_k) tensors -> ((B, H, Tq, d_k), (B, H, Tq, Tk))."""
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)  # (B, H, Tq, Tk)
    if mask is not None:
        scores = apply_mask(scores, mask)
    p_attn = scores.softmax(dim=-1)
    if dropout is not None:
        p_attn = dropout(p_attn)
    return torch.matmul(p_attn, value), p_attn


class MultiHeadedAttention(nn.Module):
    """Annotated Transformer ``MultiHeadedAttention``.

    Shape: query (B, Tq, D), key/value (B, Tk, D), mask from the mask component -> (B, Tq, D).
    """

    def __init__(self, ctx):
        super().__init__()
        d_model, h = ctx.cfg.d_model, ctx.cfg.h
        assert d_model % h == 0
        self.d_k = d_model // h
        self.h = h
        self.linears = clones(ctx.linear(d_model, d_model), 4)
        self.attn = None
        self.apply_mask = ctx.mask.apply
        self.dropout = nn.Dropout(p=ctx.cfg.dropout)

    def forward(self, query, key, value, mask=None):
        nbatches = query.size(0)
        query, key, value = [
            lin(x).view(nbatches, -1, self.h, self.d_k).transpose(1, 2)  # (B, L, D) -> (B, H, L, d_k)
            for lin, x in zip(self.linears, (query, key, value))
        ]
        x, self.attn = attention(query, key, value, mask=mask, dropout=self.dropout, apply_mask=self.apply_mask)
        x = x.transpose(1, 2).contiguous().view(nbatches, -1, self.h * self.d_k)  # (B, Tq, D)
        del query, key, value
        return self.linears[-1](x)

    def canonical_state(self) -> dict[str, torch.Tensor]:
        out = {}
        for canon, lin in zip(_CANONICAL, self.linears):
            out[f"{canon}.weight"] = lin.weight
            if lin.bias is not None:
                out[f"{canon}.bias"] = lin.bias
        return out

    def load_canonical_state(self, state: dict[str, torch.Tensor]) -> list[str]:
        notes = []
        with torch.no_grad():
            for canon, lin in zip(_CANONICAL, self.linears):
                lin.weight.copy_(state[f"{canon}.weight"])
                bias = state.get(f"{canon}.bias")
                if lin.bias is not None:
                    lin.bias.copy_(bias if bias is not None else torch.zeros_like(lin.bias))
                elif bias is not None and bool(bias.abs().max() > 0):
                    notes.append(f"{canon}.bias is non-zero but this component has no bias")
        return notes


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", MultiHeadedAttention,
                      "Annotated-style: clones(Linear, 4), heads (B, h, L, d_k), matmul",
                      "Annotated Transformer (test plugin)")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME}, summary="baseline with a from-scratch Annotated-style attention",
                    source="Annotated Transformer (test plugin)")]
