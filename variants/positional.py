"""Slot ``positional``: embedding scale and sinusoidal positional encoding.

* ``scaled``: dropout(lut(x) * sqrt(d_model) + PE) -- Vaswani et al. 2017 §3.4 and §3.5,
  Annotated ``Embeddings`` + ``PositionalEncoding`` (seeds 000, 001).
* ``unscaled_ln``: dropout(LayerNorm(lut(x) + PE)), no sqrt(d_model) -- seed 004's BERT-style
  ``TransformerEmbeddings``.
* ``scaled_input_ln``: LayerNorm(dropout(lut(x) * sqrt(d_model) + PE)) -- seed 001, whose
  ``Encoder``/``Decoder`` apply their LayerNorm to the *input* of the first layer instead of
  after the last one.

PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(pos / 10000^(2i/D)) (§3.5), a
buffer of shape (max_len, D). Shape: raw embeddings (B, L, D) -> (B, L, D).
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
    """dropout(LayerNorm(x + PE[:L])) without sqrt(D) scaling (seed 004)."""

    def __init__(self, ctx):
        super().__init__()
        self.register_buffer("pe", sinusoidal_table(ctx.cfg.max_len, ctx.cfg.d_model), persistent=False)
        self.norm = ctx.layer_norm()
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def forward(self, x):
        return self.dropout(self.norm(x + self.pe[: x.size(1)]))


class ScaledInputLayerNormPositional(ScaledPositional):
    """LayerNorm(dropout(x * sqrt(D) + PE[:L])) (seed 001's LayerNorm on the stack's input)."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.norm = ctx.layer_norm()

    def forward(self, x):
        return self.norm(super().forward(x))


@hookimpl
def harness_add_components():
    return [
        Component("scaled", "positional", ScaledPositional, "x*sqrt(d_model) + sinusoidal PE, dropout",
                  "Vaswani et al. 2017 §3.4-3.5; Annotated Embeddings/PositionalEncoding", default=True),
        Component("unscaled_ln", "positional", UnscaledLayerNormPositional,
                  "x + sinusoidal PE, then LayerNorm, dropout (no sqrt(d_model))", "seed 004 (BERT-style)",
                  differs="no sqrt(d_model) scaling and a LayerNorm after adding PE (seed 004's BERT-style "
                          "embeddings)"),
        Component("scaled_input_ln", "positional", ScaledInputLayerNormPositional,
                  "x*sqrt(d_model) + PE, dropout, then LayerNorm", "seed 001 (Encoder/Decoder norm on input)",
                  differs="a LayerNorm after x*sqrt(d_model) + PE (seed 001 applies the stack's LayerNorm to "
                          "its input)"),
    ]
