"""Adversarial plugin: sinusoidal positional encoding taken from ``PE[1:L+1]`` instead of ``PE[:L]``.

Fault: position l gets the encoding of position l + 1 (the table is built with ``max_len + 1``
rows so nothing crashes). Embedding scale (x * sqrt(d_model)) and dropout are the paper's. The
model is still a perfectly good, causal Transformer -- it just is not the one its slot names
(Vaswani et al. §3.5: PE(pos) for pos = 0, 1, ...), and every other variant differs from it.
Not declared different. Not declared buggy.

Expected: ``check`` fails with the positional component differing from its slot's reference
(x * sqrt(d_model) + PE[:L]): e.g. "positional=adv_positional_off_by_one differs from the
reference by ..." / "differs unexpectedly" against baseline.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "adv_positional_off_by_one"
EXPECT_CHECK = "fail"
EXPECT_REASON = "positional encoding PE[1:L+1] instead of PE[:L] (undeclared difference)"


def sinusoidal_table(max_len: int, d_model: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(...) (§3.5); (max_len, D) float32."""
    pos = torch.arange(max_len, dtype=torch.float32)[:, None]  # (max_len, 1)
    div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * -(math.log(10000.0) / d_model))  # (D/2,)
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div[: d_model // 2])
    return pe


class OffByOnePositional(nn.Module):
    """dropout(x * sqrt(D) + PE[1:L+1]) (the fault: should be PE[:L]). Shape (B, L, D) -> (B, L, D)."""

    def __init__(self, ctx):
        super().__init__()
        self.scale = math.sqrt(ctx.cfg.d_model)
        self.register_buffer("pe", sinusoidal_table(ctx.cfg.max_len + 1, ctx.cfg.d_model), persistent=False)
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def forward(self, x):
        return self.dropout(x * self.scale + self.pe[1: x.size(1) + 1])  # FAULT: self.pe[: x.size(1)]


@hookimpl
def harness_add_components():
    return [Component(NAME, "positional", OffByOnePositional, "x*sqrt(d_model) + sinusoidal PE, dropout",
                      "adversarial test plugin")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"positional": NAME}, summary="baseline with positions shifted by one",
                    source="adversarial test plugin")]
