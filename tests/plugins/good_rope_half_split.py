"""Correct plugin: RoPE in the half-split layout (GPT-NeoX / LLaMA-HF ``rotate_half``) that *declares*
the permutation that makes it RoFormer's rotation.

The rotation code is ``adv_rope_half_split``'s. The half-split layout pairs feature i with i + d_k/2;
RoFormer pairs 2i with 2i+1. The scores q_rot . k_rot are the paper's once the features are put in the
order (0, 2, 4, ..., 1, 3, 5, ...): the paper's pair (2i, 2i+1) lands at (i, i + d_k/2). The component
says so with ``qk_order(d_k)`` (``harness.model.PositionHooks`` applies it to q and k before
``rotate_qk``), and ``equivalent_to="rope"``: it is held to the built-in ``rope``'s formula and must
compute the same function as the ``rope_positions`` variant.

Expected: ``check --variants good_rope_half_split rope_positions`` exits 0, the two in one class.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from harness import Component, Variant, hookimpl

NAME = "good_rope_half_split"
EXPECT_CHECK = "pass"
EXPECT_REASON = ""


class HalfSplitRoPE(nn.Module):
    """x * sqrt(D) on the embeddings; q and k rotated with ``rotate_half`` (GPT-NeoX layout)."""

    def __init__(self, ctx):
        super().__init__()
        self.scale = math.sqrt(ctx.cfg.d_model)
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def forward(self, x):
        return self.dropout(x * self.scale)

    @staticmethod
    def rotate(x):
        """x (..., L, d) -> x * cos + rotate_half(x) * sin, frequencies repeated over both halves."""
        length, d = x.size(-2), x.size(-1)
        inv = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
        ang = torch.arange(length, dtype=torch.float64)[:, None] * inv  # (L, d/2)
        ang = torch.cat((ang, ang), dim=-1).to(x.device)  # (L, d)
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        rotated = torch.cat((-x2, x1), dim=-1)
        return x * ang.cos().to(x.dtype) + rotated * ang.sin().to(x.dtype)

    def rotate_qk(self, q, k):
        return self.rotate(q), self.rotate(k)

    @staticmethod
    def qk_order(d_k):
        """The canonical feature at each of this layout's positions: even features first, then odd."""
        return torch.cat((torch.arange(0, d_k, 2), torch.arange(1, d_k, 2)))


@hookimpl
def harness_add_components():
    return [Component(NAME, "positional", HalfSplitRoPE, "RoPE, rotate_half layout with its permutation declared",
                      "GPT-NeoX / LLaMA-HF (test plugin)", equivalent_to="rope")]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"positional": NAME}, summary="baseline with half-split RoPE, permutation declared",
                    source="GPT-NeoX / LLaMA-HF (test plugin)")]
