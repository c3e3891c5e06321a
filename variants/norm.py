"""Slot ``norm``: where LayerNorm sits around each sub-layer.

* ``post``: LayerNorm(x + dropout(sublayer(x))) -- Vaswani et al. 2017 §3.1, d2l §10.7
  ``AddNorm`` (seed 003), seed 001; no final LayerNorm.
* ``pre``: x + dropout(sublayer(LayerNorm(x))) plus a final LayerNorm after the encoder and
  after the decoder -- the Annotated Transformer's ``SublayerConnection`` (seeds 000, 002,
  004); Xiong et al. 2020's Pre-LN Transformer.
"""
from __future__ import annotations

from torch import nn

from harness import Component, hookimpl


class PostNormResidual(nn.Module):
    """Post-norm residual block (d2l ``AddNorm``): ``norm(x + dropout(sublayer(x)))``.

    Shape: x (B, L, D) -> (B, L, D).
    """

    final_norm = False

    def __init__(self, ctx):
        super().__init__()
        self.norm = ctx.layer_norm()
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def forward(self, x, sublayer):
        return self.norm(x + self.dropout(sublayer(x)))


class PreNormResidual(nn.Module):
    """Pre-norm residual block (Annotated ``SublayerConnection``): ``x + dropout(sublayer(norm(x)))``.

    The encoder and decoder add a final LayerNorm (``final_norm = True``).
    Shape: x (B, L, D) -> (B, L, D).
    """

    final_norm = True

    def __init__(self, ctx):
        super().__init__()
        self.norm = ctx.layer_norm()
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def forward(self, x, sublayer):
        return x + self.dropout(sublayer(self.norm(x)))


@hookimpl
def harness_add_components():
    return [
        Component("post", "norm", PostNormResidual, "LayerNorm(x + dropout(sublayer(x))), no final norm",
                  "Vaswani et al. 2017 §3.1; d2l §10.7 AddNorm (seed 003)", default=True),
        Component("pre", "norm", PreNormResidual,
                  "x + dropout(sublayer(LayerNorm(x))), final LayerNorm in encoder and decoder",
                  "Annotated Transformer SublayerConnection (seeds 000, 002, 004); Xiong et al. 2020"),
    ]
