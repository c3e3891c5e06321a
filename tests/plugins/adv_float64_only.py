"""Adversarial plugin: attention that is correct only in float64 (it games the golden reference).

Fault: in float64 the scores are ``Q K^T / sqrt(d_k)``; in any other dtype a "pre-scaled query"
path computes ``(Q * d_k ** -1) K^T`` -- 1/d_k instead of 1/sqrt(d_k), a plausible typo in a
fast path. The harness's tolerance recipe (PyTorch's ``check_out_and_grad``) sets each threshold
to ``max(atol, fudge * ref_error)`` with ``ref_error = |fp32 run - float64 run of the same
implementation|``. This component's own fp32-vs-fp64 error is the whole bug (order 0.1-1), so the
threshold grows to fudge x that and the fp32 comparison against nn.MultiheadAttention passes,
while the float64 runs agree to ~1e-15 (measured with the harness at commit 8da00b8: max
|Δ output| 0.83 against nn.MultiheadAttention, threshold 4.16, verdict "no difference"). Masks
are applied correctly: no probe leaks. Not declared buggy.

Expected: ``check`` fails because the component's fp32 run differs from its own float64 run far
beyond rounding ("fp32 run differs from the float64 run of the same variant by ... (more than the
rounding error allowed for fp32)"), or because its fp32 output is compared with the reference's
fp32 output under the *reference's* rounding error, not its own.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_float64_only"
EXPECT_CHECK = "fail"
EXPECT_REASON = "fp32 path scales by 1/d_k; correct only in float64 (inflates its own reference error)"


class Float64OnlyAttention(nn.Module):
    """Multi-head attention, right in float64, scaled by 1/d_k otherwise (the fault).

    Shape: query (B, Tq, D), key/value (B, Tk, D) -> (B, Tq, D).
    """

    def __init__(self, ctx):
        super().__init__()
        d = ctx.cfg.d_model
        self.h, self.d_k = ctx.cfg.h, d // ctx.cfg.h
        self.w_q, self.w_k, self.w_v, self.w_o = (ctx.linear(d, d) for _ in range(4))
        self.apply_mask = ctx.mask.apply
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.size(0), -1, self.h, self.d_k).transpose(1, 2)  # (B, L, D) -> (B, H, L, d_k)

    def forward(self, query, key, value, mask=None):
        b = query.size(0)
        q, k, v = self.split(self.w_q(query)), self.split(self.w_k(key)), self.split(self.w_v(value))
        if q.dtype == torch.float64:
            scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.d_k)  # (B, H, Tq, Tk)
        else:
            scores = torch.matmul(q * self.d_k ** -1, k.transpose(-2, -1))  # FAULT: should be d_k ** -0.5
        if mask is not None:
            scores = self.apply_mask(scores, mask)
        x = torch.matmul(self.dropout(scores.softmax(dim=-1)), v)  # (B, H, Tq, d_k)
        return self.w_o(x.transpose(1, 2).reshape(b, -1, self.h * self.d_k))  # (B, Tq, D)


@hookimpl
def harness_add_components():
    return [Component(NAME, "attention", Float64OnlyAttention,
                      "multi-head attention with a pre-scaled-query fast path", "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"attention": NAME}, summary="baseline whose attention is right only in float64",
                    source="adversarial test plugin")]
