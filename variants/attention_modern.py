"""Slot ``attention``: attention as today's decoder-only models write it.

* ``gqa``: grouped-query attention (Ainslie et al. 2023, GQA; LLaMA-2 70B, LLaMA-3, Mistral, Gemma):
  ``n_kv`` key/value heads (``ModelConfig.n_kv_heads``; 0 = not set -> h // 2 when h is even, else 1),
  each serving a contiguous group of h / n_kv query heads: query head i reads K/V head i // (h / n_kv),
  as LLaMA's ``repeat_kv`` (``x[:, :, None].expand(...).reshape(...)``, i.e. ``repeat_interleave``
  over the head axis). With n_kv = h it is multi-head attention.
* ``qk_norm``: multi-head attention with QK-norm (RMSNorm over d_k on each head's q and k, gains
  ``q_norm.weight``, ``k_norm.weight`` (d_k,), before RoPE; Gemma 3, Qwen3; OLMo 2 normalises the whole
  projection before the head split instead), held to the check's
  ``qk_rmsnorm`` formula.
* ``mqa``: multi-query attention (Shazeer 2019, "Fast Transformer Decoding"; PaLM, Falcon): one K/V head
  shared by every query head (n_kv = 1 whatever the config says).

Canonical parameters: ``w_q`` (D, D), ``w_k`` and ``w_v`` (n_kv d_k, D) -- their own shape, rows
grouped per K/V head --, ``w_o`` (D, D), with biases when the ``projections`` slot gives them. The
check's float64 reference (:func:`harness.checks.contract_attention.reference_attention`) reads n_kv
from the exported ``w_k`` rows, so these components are held to the attention slot's reference with
no declaration; their variants have no canonical counterpart in multi-head variants (other shapes)
and stand in their own equivalence class.

Shape of ``forward``: query (B, Tq, D), key/value (B, Tk, D), mask from the mask component -> (B, Tq, D).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from harness import Component, hookimpl


def kv_heads(cfg) -> int:
    """K/V heads of ``gqa`` for ``cfg``: ``cfg.n_kv_heads`` when set, else h // 2 (h even) or 1."""
    if cfg.n_kv_heads:
        return cfg.n_kv_heads
    return cfg.h // 2 if cfg.h % 2 == 0 else 1


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """LLaMA ``repeat_kv``: (B, n_kv, L, d_k) -> (B, n_kv * groups, L, d_k), K/V head j serving query
    heads j*groups .. (j+1)*groups - 1 (``repeat_interleave`` over the head axis, never ``repeat``)."""
    if groups == 1:
        return x
    b, n_kv, length, d_k = x.shape
    return x[:, :, None].expand(b, n_kv, groups, length, d_k).reshape(b, n_kv * groups, length, d_k)


class GroupedQueryAttention(nn.Module):
    """Grouped-query attention: h query heads, ``n_kv`` K/V heads (see the module docstring)."""

    def __init__(self, ctx, n_kv: int | None = None):
        super().__init__()
        d, self.h = ctx.cfg.d_model, ctx.cfg.h
        self.d_k = d // self.h
        self.n_kv = n_kv or kv_heads(ctx.cfg)
        self.w_q = ctx.linear(d, d)
        self.w_k = ctx.linear(d, self.n_kv * self.d_k)
        self.w_v = ctx.linear(d, self.n_kv * self.d_k)
        self.w_o = ctx.linear(d, d)
        self.apply_mask = ctx.mask.apply
        self.positions = ctx.positions
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def canonical_state(self):
        out = {}
        for name in ("w_q", "w_k", "w_v", "w_o"):
            lin = getattr(self, name)
            out[f"{name}.weight"] = lin.weight
            if lin.bias is not None:
                out[f"{name}.bias"] = lin.bias
        return out

    def load_canonical_state(self, state):
        notes = []
        with torch.no_grad():
            for name in ("w_q", "w_k", "w_v", "w_o"):
                lin = getattr(self, name)
                lin.weight.copy_(state[f"{name}.weight"])
                bias = state.get(f"{name}.bias")
                if lin.bias is not None:
                    lin.bias.copy_(bias if bias is not None else torch.zeros_like(lin.bias))
                elif bias is not None and bool(bias.abs().max() > 0):
                    notes.append(f"{name}.bias is non-zero but this component has no bias")
        return notes

    def split(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        return x.view(x.size(0), x.size(1), heads, self.d_k).transpose(1, 2)  # (B, L, heads*d_k) -> (B, heads, L, d_k)

    def forward(self, query, key, value, mask=None):
        b, tq = query.size(0), query.size(1)
        q = self.split(self.w_q(query), self.h)  # (B, H, Tq, d_k)
        k = self.split(self.w_k(key), self.n_kv)  # (B, n_kv, Tk, d_k)
        v = self.split(self.w_v(value), self.n_kv)  # (B, n_kv, Tk, d_k)
        q, k = self.positions.rotate(q, k)
        k, v = repeat_kv(k, self.h // self.n_kv), repeat_kv(v, self.h // self.n_kv)  # (B, H, Tk, d_k)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.d_k)  # (B, H, Tq, Tk)
        scores = self.positions.bias(scores)
        if mask is not None:
            scores = self.apply_mask(scores, mask)
        x = torch.matmul(self.dropout(scores.softmax(dim=-1)), v)  # (B, H, Tq, d_k)
        return self.w_o(x.transpose(1, 2).reshape(b, tq, self.h * self.d_k))  # (B, Tq, D)


class QKNormAttention(GroupedQueryAttention):
    """Multi-head attention with QK-norm: each head's q and k RMS-normalised over d_k (eps 1e-6) times
    learned gains ``q_norm.weight``, ``k_norm.weight`` (d_k,), after the head split and before RoPE
    (Gemma 3 and Qwen3's ``q_norm`` / ``k_norm``; OLMo 2 normalises the whole projection instead;
    Dehghani et al. 2023 introduced it with LayerNorm to keep attention logits bounded)."""

    eps = 1e-6

    def __init__(self, ctx):
        super().__init__(ctx, n_kv=ctx.cfg.h)
        self.q_norm = nn.Parameter(torch.ones(self.d_k))
        self.k_norm = nn.Parameter(torch.ones(self.d_k))

    def canonical_state(self):
        return {**super().canonical_state(), "q_norm.weight": self.q_norm, "k_norm.weight": self.k_norm}

    def load_canonical_state(self, state):
        with torch.no_grad():
            self.q_norm.copy_(state["q_norm.weight"])
            self.k_norm.copy_(state["k_norm.weight"])
        return super().load_canonical_state(state)

    def rms(self, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * g  # (B, H, L, d_k)

    def forward(self, query, key, value, mask=None):
        b, tq = query.size(0), query.size(1)
        q = self.rms(self.split(self.w_q(query), self.h), self.q_norm)  # (B, H, Tq, d_k)
        k = self.rms(self.split(self.w_k(key), self.h), self.k_norm)  # (B, H, Tk, d_k)
        v = self.split(self.w_v(value), self.h)  # (B, H, Tk, d_k)
        q, k = self.positions.rotate(q, k)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.d_k)  # (B, H, Tq, Tk)
        scores = self.positions.bias(scores)
        if mask is not None:
            scores = self.apply_mask(scores, mask)
        x = torch.matmul(self.dropout(scores.softmax(dim=-1)), v)  # (B, H, Tq, d_k)
        return self.w_o(x.transpose(1, 2).reshape(b, tq, self.h * self.d_k))  # (B, Tq, D)


@hookimpl
def harness_add_components():
    return [
        Component("gqa", "attention", GroupedQueryAttention,
                  "grouped-query attention: n_kv_heads K/V heads (default h/2), each serving a contiguous group of "
                  "query heads (repeat_kv)", "Ainslie et al. 2023 (GQA); LLaMA repeat_kv"),
        Component("mqa", "attention", lambda ctx: GroupedQueryAttention(ctx, n_kv=1),
                  "multi-query attention: one K/V head shared by every query head", "Shazeer 2019; PaLM"),
        Component("qk_norm", "attention", QKNormAttention,
                  "multi-head attention with RMSNorm on each head's q and k (gains (d_k,)), before RoPE",
                  "Gemma 3, Qwen3 (per head); Dehghani et al. 2023 (QK LayerNorm)",
                  differs="QK-norm: each head's q and k RMS-normalised over d_k with learned gains before the dot "
                          "product (Gemma 3, Qwen3)", reference="qk_rmsnorm"),
    ]
