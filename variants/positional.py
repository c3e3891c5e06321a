"""Slot ``positional``: embedding scale and positions -- added to the embeddings, or inside attention.

* ``scaled``: dropout(lut(x) * sqrt(d_model) + PE) -- Vaswani et al. 2017 §3.4 and §3.5,
  Annotated ``Embeddings`` + ``PositionalEncoding`` (notes 000, 001).
* ``unscaled_ln``: dropout(LayerNorm(lut(x) + PE)), no sqrt(d_model) -- note 004's BERT-style
  ``TransformerEmbeddings``.
* ``unscaled``: dropout(lut(x) + PE), the paper's embedding with only the sqrt(d_model) scale taken
  out: the controlled answer to the notes' question "why scale by sqrt(d_model)?" (notes 000, 001;
  ``unscaled_ln`` drops the scale *and* adds a LayerNorm).
* ``scaled_input_ln``: LayerNorm(dropout(lut(x) * sqrt(d_model) + PE)) -- note 001, whose
  ``Encoder``/``Decoder`` apply their LayerNorm to the *input* of the first layer instead of
  after the last one.

* ``nope``: dropout(lut(x) * sqrt(d_model)), no positions anywhere (NoPE): the controlled answer to note
  004's question "why encode positions at all?". Without them the encoder is permutation-equivariant
  and cross-attention sums over its outputs, so the whole model's logits do not change when the
  source tokens are shuffled (tests/test_no_positions.py): it cannot copy or reverse, it can sort.

* ``learned``: dropout(lut(x) * sqrt(d_model) + P[:L]) with P a learned (max_len, D) table --
  absolute learned positions (Gehring et al. 2017; GPT-2's ``wpe``, BERT's position embeddings),
  canonical ``weight``. The sqrt(d_model) scale is kept (the paper's), so ``modern_learned_pos``
  changes the positions only. Rows past the longest trained length are never trained (they keep
  their initial values); a length beyond ``max_len`` raises ``ValueError`` (never clamped:
  clamping would silently give two positions one vector).
* ``rope``: rotary positions (Su et al. 2021, RoFormer, eq. 34): the embeddings get only
  x * sqrt(d_model); in every self-attention q and k of each head are rotated pairwise, features
  (2i, 2i+1) by the angle pos * theta_i, theta_i = 10000^(-2i/d_k) -- the paper's *interleaved*
  layout (GPT-J, Meta's LLaMA code). Cross-attention gets no rotation.
* ``alibi``: attention with linear biases (Press et al. 2022): x * sqrt(d_model) on the
  embeddings and -m_h * |i - j| added to head h's scaled scores in every self-attention, with the
  paper's slopes m_h = 2^(-8h/H), h = 1..H (H a power of 2; otherwise the paper's rule: the
  slopes of the closest power of 2 below, then every other slope of twice that). The paper
  defines it for causal language models (j <= i); the encoder uses the symmetric |i - j| (as
  bidirectional ALiBi implementations do). Cross-attention gets no bias.

PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(pos / 10000^(2i/D)) (§3.5), a
buffer of shape (max_len, D). Shape: raw embeddings (B, L, D) -> (B, L, D). RoPE and ALiBi
compute their tables on the fly (any length; no buffer, no parameter).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from harness import Component, hookimpl


def sinusoidal_table(max_len: int, d_model: int) -> torch.Tensor:
    """The §3.5 table, shape (max_len, d_model), float32."""
    pe = torch.zeros(max_len, d_model)
    position = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)  # (max_len, 1)
    div_term = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * -(math.log(10000.0) / d_model))
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term[: d_model // 2])
    return pe


class ScaledPositional(nn.Module):
    """dropout(x * sqrt(D) + PE[:L]) (Vaswani et al. §3.4/§3.5)."""

    def __init__(self, ctx):
        super().__init__()
        self.scale = math.sqrt(ctx.cfg.d_model)
        self.register_buffer("pe", sinusoidal_table(ctx.cfg.max_len, ctx.cfg.d_model), persistent=False)
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def forward(self, x):
        return self.dropout(x * self.scale + self.pe[: x.size(1)])


class UnscaledLayerNormPositional(nn.Module):
    """dropout(LayerNorm(x + PE[:L])) without sqrt(D) scaling (note 004)."""

    def __init__(self, ctx):
        super().__init__()
        self.register_buffer("pe", sinusoidal_table(ctx.cfg.max_len, ctx.cfg.d_model), persistent=False)
        self.norm = ctx.layer_norm()
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def forward(self, x):
        return self.dropout(self.norm(x + self.pe[: x.size(1)]))


class UnscaledPositional(nn.Module):
    """dropout(x + PE[:L]): §3.4-3.5 without the sqrt(D) scale of the embeddings."""

    def __init__(self, ctx):
        super().__init__()
        self.register_buffer("pe", sinusoidal_table(ctx.cfg.max_len, ctx.cfg.d_model), persistent=False)
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def forward(self, x):
        return self.dropout(x + self.pe[: x.size(1)])


class ScaledInputLayerNormPositional(ScaledPositional):
    """LayerNorm(dropout(x * sqrt(D) + PE[:L])) (note 001's LayerNorm on the stack's input)."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.norm = ctx.layer_norm()

    def forward(self, x):
        return self.norm(super().forward(x))


class LearnedPositional(nn.Module):
    """dropout(x * sqrt(D) + weight[:L]), ``weight`` a learned (max_len, D) table (GPT-2 ``wpe``).

    Raises:
        ValueError: a sequence longer than ``max_len`` (no row for its positions).
    """

    def __init__(self, ctx):
        super().__init__()
        self.scale = math.sqrt(ctx.cfg.d_model)
        self.weight = nn.Parameter(torch.zeros(ctx.cfg.max_len, ctx.cfg.d_model))
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def forward(self, x):
        if x.size(1) > self.weight.size(0):
            raise ValueError(f"learned positions: a sequence of length {x.size(1)} needs more than the "
                             f"{self.weight.size(0)} learned rows (model.max_len)")
        return self.dropout(x * self.scale + self.weight[: x.size(1)])


class ScaledOnly(nn.Module):
    """dropout(x * sqrt(D)): the embedding side of a position component that acts inside attention."""

    def __init__(self, ctx):
        super().__init__()
        self.scale = math.sqrt(ctx.cfg.d_model)
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def forward(self, x):
        return self.dropout(x * self.scale)


class NoPositional(ScaledOnly):
    """dropout(x * sqrt(D)) and nothing inside attention: the paper's embedding scale, no positional information
    at all (note 004's question; Vaswani et al. 2017 §3.5 says why the PE is there: the model has no recurrence
    or convolution). RoPE and ALiBi share its embedding side and add positions inside attention."""


def rope_angles(length: int, d: int, device, dtype, base: float = 10000.0):
    """(cos, sin) of pos * theta_i, each (length, d/2); theta_i = base^(-2i/d) (RoFormer eq. 15)."""
    work = torch.float64 if dtype == torch.float64 else torch.float32
    inv = base ** (-torch.arange(0, d, 2, device=device, dtype=work) / d)  # (d/2,)
    ang = torch.arange(length, device=device, dtype=work)[:, None] * inv  # (L, d/2)
    return ang.cos().to(dtype), ang.sin().to(dtype)


class RotaryPositional(ScaledOnly):
    """RoPE (Su et al. 2021), interleaved pairs (2i, 2i+1); the embeddings get x * sqrt(D) only."""

    def __init__(self, ctx):
        super().__init__(ctx)
        if (ctx.cfg.d_model // ctx.cfg.h) % 2:
            raise ValueError(f"RoPE rotates feature pairs: d_k = d_model / h must be even, got "
                             f"{ctx.cfg.d_model // ctx.cfg.h}")

    @staticmethod
    def rotate(x):
        """x (..., L, d_k) -> each pair (x_2i, x_2i+1) rotated by pos * theta_i."""
        cos, sin = rope_angles(x.size(-2), x.size(-1), x.device, x.dtype)  # (L, d_k/2)
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)

    def rotate_qk(self, q, k):
        return self.rotate(q), self.rotate(k)


def alibi_slopes(h: int) -> torch.Tensor:
    """(H,) the paper's head slopes: 2^(-8i/H), i = 1..H for H a power of 2; else those of the closest
    power of 2 below and every other slope of twice that (Press et al. 2022 §3 and its code)."""
    def power_of_2(n):
        return [2.0 ** (-8.0 * i / n) for i in range(1, n + 1)]

    closest = 2 ** int(math.floor(math.log2(h)))
    slopes = power_of_2(closest) + power_of_2(2 * closest)[0::2][: h - closest]
    return torch.tensor(slopes, dtype=torch.float64)


class ALiBiPositional(ScaledOnly):
    """ALiBi (Press et al. 2022): -m_h * |i - j| added to the scaled scores; x * sqrt(D) on the embeddings."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.h = ctx.cfg.h
        # (H,) float64, built once: a tensor made from Python numbers in forward is a host-to-device
        # copy on every step, which a CUDA graph cannot capture (results/reference/gpu-h200-run4).
        self.register_buffer("slopes", alibi_slopes(self.h), persistent=False)

    def score_bias(self, tq, tk, device, dtype):
        """(H, Tq, Tk): -m_h * |i - j|."""
        dist = (torch.arange(tq, device=device)[:, None] - torch.arange(tk, device=device)[None, :]).abs()  # (Tq, Tk)
        return (-self.slopes.to(device)[:, None, None] * dist).to(dtype)


@hookimpl
def harness_add_components():
    return [
        Component("scaled", "positional", ScaledPositional, "x*sqrt(d_model) + sinusoidal PE, dropout",
                  "Vaswani et al. 2017 §3.4-3.5; Annotated Embeddings/PositionalEncoding", default=True),
        Component("unscaled_ln", "positional", UnscaledLayerNormPositional,
                  "x + sinusoidal PE, then LayerNorm, dropout (no sqrt(d_model))", "note 004 (BERT-style)",
                  differs="no sqrt(d_model) scaling and a LayerNorm after adding PE (note 004's BERT-style "
                          "embeddings)"),
        Component("unscaled", "positional", UnscaledPositional, "x + sinusoidal PE, dropout (no sqrt(d_model))",
                  "Vaswani et al. 2017 §3.4 without its scale; the notes' question (notes 000, 001)",
                  differs="no sqrt(d_model) scaling of the embeddings (the paper's embedding otherwise)",
                  reference="unscaled_pe"),
        Component("scaled_input_ln", "positional", ScaledInputLayerNormPositional,
                  "x*sqrt(d_model) + PE, dropout, then LayerNorm", "note 001 (Encoder/Decoder norm on input)",
                  differs="a LayerNorm after x*sqrt(d_model) + PE (note 001 applies the stack's LayerNorm to "
                          "its input)"),
        Component("nope", "positional", NoPositional, "x*sqrt(d_model), dropout; no positions anywhere",
                  "Vaswani et al. 2017 §3.5 ablated; note 004 asks why positions are encoded",
                  differs="no positional information: the sinusoidal PE left out, nothing inside attention",
                  reference="no_positions"),
        Component("learned", "positional", LearnedPositional, "x*sqrt(d_model) + a learned (max_len, D) table, dropout",
                  "Gehring et al. 2017; GPT-2 wpe; BERT position embeddings",
                  differs="learned absolute positions instead of the sinusoidal table (GPT-2, BERT)",
                  reference="learned_absolute"),
        Component("rope", "positional", RotaryPositional,
                  "x*sqrt(d_model); q and k rotated in self-attention (interleaved pairs)", "Su et al. 2021 (RoFormer)",
                  differs="no additive PE: q and k of every self-attention rotated by position (RoFormer eq. 34, "
                          "interleaved pairs, theta_i = 10000^(-2i/d_k))", reference="rotary"),
        Component("alibi", "positional", ALiBiPositional,
                  "x*sqrt(d_model); -m_h |i - j| added to self-attention scores", "Press et al. 2022 (ALiBi)",
                  differs="no additive PE: -m_h * |i - j| added to the scores of every self-attention, slopes "
                          "2^(-8h/H), interleaved from 2n heads when H is not a power of 2 (Press et al. 2022)",
                  reference="linear_biases"),
    ]
