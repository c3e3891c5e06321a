"""Slot ``norm``: where LayerNorm sits around each sub-layer.

* ``post``: LayerNorm(x + dropout(sublayer(x))) -- Vaswani et al. 2017 §3.1, d2l §10.7
  ``AddNorm`` (note 003), note 001; no final LayerNorm.
* ``pre``: x + dropout(sublayer(LayerNorm(x))) plus a final LayerNorm after the encoder and
  after the decoder -- the Annotated Transformer's ``SublayerConnection`` (notes 000, 002,
  004); Xiong et al. 2020's Pre-LN Transformer.
* ``parallel``: one LayerNorm for all of a layer's sub-layers, their outputs summed (GPT-J; PaLM §2).
* ``deepnorm``: LayerNorm(alpha x + dropout(sublayer(x))), post-norm with DeepNet's up-scaled residual
  (Wang et al. 2022 §3, Figure 2): alpha = 0.81 (N^4 M)^(1/16) in the encoder, (3M)^(1/4) in the
  decoder (N = M = ``model.N``), read from where the block sits (``ctx.stack``, ``ctx.N``). Its other half,
  the beta-scaled initialisation, is ``init=deepnet``; variant ``deepnet`` takes both.
"""
from __future__ import annotations

from torch import nn

from harness import Component, hookimpl

from .init import deepnet_alpha, one_stack


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


class ParallelResidual(nn.Module):
    """Parallel block (GPT-J; PaLM §2): ``x + sum_i dropout(sublayer_i(norm(x)))``, one LayerNorm for all.

    ``parallel = True``: the layer calls ``forward(x, sublayers)`` once with all its sub-layers
    (:func:`harness.model.run_sublayers`). Encoder: y = x + Attn(LN(x)) + FFN(LN(x)), as GPT-J / PaLM.
    Decoder (encoder-decoder, which GPT-J and PaLM do not cover): self-attention, cross-attention (queries
    LN(x), keys and values the memory) and the FFN all from the same LN(x), summed -- the one rule "every
    sub-layer of a layer reads LN(x)", so no sub-layer waits for another (the point of the parallel
    formulation); the cross-attention then cannot condition on the same layer's self-attention output.
    The residual stream is never normalised, so the stacks end with a LayerNorm (``final_norm = True``,
    GPT-J's ``ln_f``), as pre-norm. Dropout on each branch (GPT-J's resid_dropout per sub-layer).
    Shape: x (B, L, D) -> (B, L, D).
    """

    final_norm = True
    parallel = True

    def __init__(self, ctx):
        super().__init__()
        self.norm = ctx.layer_norm()
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def forward(self, x, sublayers):
        y = self.norm(x)
        return x + sum(self.dropout(sublayer(y)) for sublayer in sublayers)


class DeepNormResidual(nn.Module):
    """DeepNorm (Wang et al. 2022 §3): ``norm(alpha * x + dropout(sublayer(x)))``, post-norm, no final LayerNorm.

    ``alpha`` (a float, not a parameter) is DeepNet's for the block's stack: 0.81 (N^4 M)^(1/16) in the
    encoder, (3M)^(1/4) in the decoder, (2M)^(1/4) in a decoder-only or prefix-LM stack, N = M = ``ctx.N``
    (:func:`variants.init.deepnet_alpha`); a block built outside a stack takes the encoder's. Shape: x (B, L, D) -> (B, L, D).
    """

    final_norm = False

    def __init__(self, ctx):
        super().__init__()
        self.norm = ctx.layer_norm()
        self.dropout = nn.Dropout(ctx.cfg.dropout)
        self.alpha = deepnet_alpha(ctx.stack, ctx.N, ctx.N, one_stack(ctx))

    def forward(self, x, sublayer):
        return self.norm(self.alpha * x + self.dropout(sublayer(x)))


@hookimpl
def harness_add_components():
    return [
        Component("post", "norm", PostNormResidual, "LayerNorm(x + dropout(sublayer(x))), no final norm",
                  "Vaswani et al. 2017 §3.1; d2l §10.7 AddNorm (note 003)", default=True),
        Component("pre", "norm", PreNormResidual,
                  "x + dropout(sublayer(LayerNorm(x))), final LayerNorm in encoder and decoder",
                  "Annotated Transformer SublayerConnection (notes 000, 002, 004); Xiong et al. 2020"),
        Component("parallel", "norm", ParallelResidual,
                  "x + sum_i dropout(sublayer_i(LayerNorm(x))): attention and FFN from one LayerNorm, summed; "
                  "final LayerNorm in encoder and decoder",
                  "GPT-J (Wang & Komatsuzaki 2021); PaLM (Chowdhery et al. 2022 §2, Parallel Layers)",
                  differs="parallel block: every sub-layer of a layer reads the same LayerNorm(x) and their outputs "
                          "are summed into the residual (decoder: self-attention, cross-attention and FFN all from "
                          "one LN(x)), not chained one after another",
                  reference="parallel_block"),
        Component("deepnorm", "norm", DeepNormResidual,
                  "LayerNorm(alpha x + dropout(sublayer(x))), alpha 0.81 (N^4 M)^(1/16) (encoder), (3M)^(1/4) "
                  "(decoder)",
                  "Wang et al. 2022 (DeepNet) §3, Figure 2, Table 1",
                  differs="DeepNorm: the residual x scaled by DeepNet's alpha > 1 inside post-norm, "
                          "LayerNorm(alpha x + sublayer(x)) (Wang et al. 2022)"),
    ]
