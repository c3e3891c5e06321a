"""Adversarial plugin: attention whose causal leak is gated by a parameter that starts at 0.

Fault: ``forward`` returns ``w_o(masked_attention + gate * unmasked_attention)``: the ordinary
masked multi-head attention plus ``gate`` times the same attention computed *without any mask*
(every key, future and padding included). ``gate`` is an ``nn.Parameter`` initialised to 0 and
left out of ``canonical_state()`` (which lists only w_q, w_k, w_v, w_o, so ``canonical_init`` and
loading a reference state never touch it). At initialisation and after loading canonical weights
the component is exactly scaled dot-product attention: every forward probe and every comparison
with ``nn.MultiheadAttention`` passes. The optimizer trains ``gate`` like any parameter; the
gradient on it is <dL/d out, unmasked_attention>, non-zero from the first step, and the copy task
rewards looking one token ahead (the next decoder input is the current label), so after training
the decoder sees the future. Not declared buggy.

Expected: ``check`` fails, for instance because the component has a parameter outside its
canonical layout ("parameter(s) not in the canonical state: ...gate") or because a causal probe
run after perturbing *every* parameter (or a gradient probe d logits[t] / d gate) leaks:
"decoder position p changed ... when the target tokens after position p changed". ``run`` must
mark the variant invalid (a causal probe after training leaks).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_gated_leak"
EXPECT_CHECK = "fail"
EXPECT_REASON = "non-canonical parameter gates an unmasked attention path: causal at init, leaks after training"

_CANONICAL = ("w_q", "w_k", "w_v", "w_o")


class GatedLeakAttention(nn.Module):
    """Masked multi-head attention + ``gate`` x unmasked attention (the fault), gate = 0 at start.

    Shape: query (B, Tq, D), key/value (B, Tk, D) -> (B, Tq, D).
    """

    def __init__(self, ctx):
        super().__init__()
        d = ctx.cfg.d_model
        self.h, self.d_k = ctx.cfg.h, d // ctx.cfg.h
        self.w_q, self.w_k, self.w_v, self.w_o = (ctx.linear(d, d) for _ in range(4))
        self.gate = nn.Parameter(torch.zeros(()))  # FAULT: trainable, not canonical, 0 at init
        self.apply_mask = ctx.mask.apply
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.size(0), -1, self.h, self.d_k).transpose(1, 2)  # (B, L, D) -> (B, H, L, d_k)

    def forward(self, query, key, value, mask=None):
        b = query.size(0)
        q, k, v = self.split(self.w_q(query)), self.split(self.w_k(key)), self.split(self.w_v(value))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.d_k)  # (B, H, Tq, Tk)
        masked = scores if mask is None else self.apply_mask(scores, mask)
        x = torch.matmul(self.dropout(masked.softmax(dim=-1)), v)  # (B, H, Tq, d_k)
        x = x + self.gate * torch.matmul(scores.softmax(dim=-1), v)  # FAULT: unmasked path
        return self.w_o(x.transpose(1, 2).reshape(b, -1, self.h * self.d_k))  # (B, Tq, D)

    def canonical_state(self):
        out = {}
        for name in _CANONICAL:
            lin = getattr(self, name)
            out[f"{name}.weight"] = lin.weight
            if lin.bias is not None:
                out[f"{name}.bias"] = lin.bias
        return out  # ``gate`` deliberately missing

    def load_canonical_state(self, state):
        notes = []
        with torch.no_grad():
            for name in _CANONICAL:
                lin = getattr(self, name)
                lin.weight.copy_(state[f"{name}.weight"])
                bias = state.get(f"{name}.bias")
                if lin.bias is not None:
                    lin.bias.copy_(bias if bias is not None else torch.zeros_like(lin.bias))
                elif bias is not None and bool(bias.abs().max() > 0):
                    notes.append(f"{name}.bias is non-zero but this component has no bias")
        return notes


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", GatedLeakAttention,
                      "multi-head attention with a learnable extra path", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME}, summary="baseline with a gate-0 unmasked attention path",
                    source="adversarial test plugin")]
