"""Adversarial plugin: QK-norm whose gains are never applied.

Fault: the gains ``q_norm.weight``, ``k_norm.weight`` (d_k,) exist and are exported, but q and k are only
RMS-normalised: the gains get no gradient. Declared as the per-head QK-norm formula
(``reference="qk_rmsnorm"``).

Expected: ``check`` fails naming the fault first ("gains ... never applied"), not "wrong from position 1 on".
"""
from __future__ import annotations

import math

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_qk_norm_gain_unused"
EXPECT_CHECK = "fail"
EXPECT_REASON = "QK-norm gains q_norm.weight, k_norm.weight never applied"


class QKNormOverDModel(nn.Module):
    """Shape: query (B, Tq, D), key/value (B, Tk, D) -> (B, Tq, D)."""

    def __init__(self, ctx):
        super().__init__()
        d = ctx.cfg.d_model
        self.h, self.d_k = ctx.cfg.h, d // ctx.cfg.h
        self.w_q, self.w_k, self.w_v, self.w_o = (ctx.linear(d, d) for _ in range(4))
        self.q_norm, self.k_norm = nn.Parameter(torch.ones(self.d_k)), nn.Parameter(torch.ones(self.d_k))
        self.apply_mask = ctx.mask.apply
        self.positions = ctx.positions
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def canonical_state(self):
        out = {f"{n}.{p}": t for n in ("w_q", "w_k", "w_v", "w_o") for p, t in getattr(self, n).named_parameters()}
        return {**out, "q_norm.weight": self.q_norm, "k_norm.weight": self.k_norm}

    def load_canonical_state(self, state):
        with torch.no_grad():
            for name, t in self.canonical_state().items():
                t.copy_(state[name])
        return []

    def normed(self, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        x = x.view(x.size(0), x.size(1), self.h, self.d_k).transpose(1, 2)  # (B, H, L, d_k)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)  # FAULT: gain g never applied

    def forward(self, query, key, value, mask=None):
        b, tq = query.size(0), query.size(1)
        q, k = self.normed(self.w_q(query), self.q_norm), self.normed(self.w_k(key), self.k_norm)
        v = self.w_v(value).view(b, -1, self.h, self.d_k).transpose(1, 2)  # (B, H, Tk, d_k)
        q, k = self.positions.rotate(q, k)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.d_k)  # (B, H, Tq, Tk)
        scores = self.positions.bias(scores)
        if mask is not None:
            scores = self.apply_mask(scores, mask)
        x = torch.matmul(self.dropout(scores.softmax(dim=-1)), v)  # (B, H, Tq, d_k)
        return self.w_o(x.transpose(1, 2).reshape(b, tq, self.h * self.d_k))  # (B, Tq, D)


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", QKNormOverDModel, "QK-norm, " + NAME, "adversarial test plugin",
                      differs="QK-norm (RMSNorm on each head's q and k)", reference="qk_rmsnorm")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME}, summary="baseline with a from-scratch QK-norm",
                    source="adversarial test plugin")]
