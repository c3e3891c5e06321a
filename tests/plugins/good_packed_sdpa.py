"""Correct plugin: fused attention with one packed QKV projection, written from docs/components.md alone.

One ``nn.Linear(D, 3D)`` whose output rows are [q; k; v] (nanoGPT's ``c_attn``, timm's ``qkv``), the
heads split as (B, H, L, d_k), ``F.scaled_dot_product_attention`` with the mask component's mask made
into an additive bias, positions through ``ctx.positions``. Its canonical ``w_q``, ``w_k``, ``w_v`` are
row slices (views) of the packed weight and bias: the checks compare their gradients as the same
slices of the packed gradient.

Expected: ``check --variants good_packed_sdpa baseline`` exits 0 with the two in one equivalence
class (the same function as the paper's baseline from the same canonical weights).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from harness import Component, Variant, hookimpl

NAME = "good_packed_sdpa"
EXPECT_CHECK = "pass"
EXPECT_REASON = ""


class PackedQKVAttention(nn.Module):
    """Scaled dot-product multi-head attention, packed q/k/v projection, SDPA.

    Shape: query (B, Tq, D), key/value (B, Tk, D) -> (B, Tq, D).
    """

    def __init__(self, ctx):
        super().__init__()
        d = ctx.cfg.d_model
        self.d, self.h, self.d_k = d, ctx.cfg.h, d // ctx.cfg.h
        self.qkv = ctx.linear(d, 3 * d)  # rows [w_q; w_k; w_v]
        self.out = ctx.linear(d, d)
        self.mask, self.positions, self.p = ctx.mask, ctx.positions, ctx.cfg.dropout

    def heads(self, x):
        return x.view(x.size(0), x.size(1), self.h, self.d_k).transpose(1, 2)  # (B, L, D) -> (B, H, L, d_k)

    def forward(self, query, key, value, mask=None):
        w, b = self.qkv.weight, self.qkv.bias
        if query is key is value:
            q, k, v = self.qkv(query).split(self.d, dim=-1)
        else:
            q = F.linear(query, w[: self.d], None if b is None else b[: self.d])
            k, v = F.linear(key, w[self.d:], None if b is None else b[self.d:]).split(self.d, dim=-1)
        q, k = self.positions.rotate(self.heads(q), self.heads(k))
        bias = torch.zeros(q.size(0), 1, q.size(2), k.size(2), dtype=q.dtype, device=q.device)
        if mask is not None:
            bias = self.mask.apply(bias, mask)
        bias = self.positions.bias(bias)
        x = F.scaled_dot_product_attention(q, k, self.heads(v), attn_mask=bias,
                                           dropout_p=self.p if self.training else 0.0)
        return self.out(x.transpose(1, 2).reshape(query.size(0), -1, self.d))

    def canonical_state(self):
        w, b = self.qkv.weight, self.qkv.bias
        out = {"w_o.weight": self.out.weight}
        for i, name in enumerate(("w_q", "w_k", "w_v")):
            out[f"{name}.weight"] = w[i * self.d:(i + 1) * self.d]
            if b is not None:
                out[f"{name}.bias"] = b[i * self.d:(i + 1) * self.d]
        if self.out.bias is not None:
            out["w_o.bias"] = self.out.bias
        return out

    def load_canonical_state(self, state):
        with torch.no_grad():
            for name, t in self.canonical_state().items():
                t.copy_(state[name])
        return []


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", PackedQKVAttention, "packed qkv Linear + SDPA", "written from docs/components.md")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME}, summary="baseline with packed-QKV SDPA attention",
                    source="docs/components.md")]
