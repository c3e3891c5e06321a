"""Correct plugin: DeepNet (Wang et al. 2022, "DeepNet: Scaling Transformers to 1,000 Layers"), written from
docs/plugins.md ("BuildContext", "Initialisation: the init slot, and a component that initialises itself")
and docs/components.md's attention contract, as a plugin author would, without the built-in ``deepnet``.

DeepNet has two halves (paper §3, Figure 2; Table 1's encoder-decoder column, N encoder and M decoder layers,
here N = M = ``ctx.N``):

* DeepNorm, the residual: ``x_{l+1} = LayerNorm(alpha x_l + G(x_l))``, encoder alpha = 0.81 (N^4 M)^(1/16),
  decoder alpha = (3M)^(1/4): the ``norm`` component ``deepnet_plugin_norm`` reads its stack from
  ``ctx.stack`` and the depth from ``ctx.N``.
* The initialisation: ``xavier_normal_(w, gain=beta)`` for the FFN matrices and the value and output
  projections, ``xavier_normal_(w, gain=1)`` for the query and key projections, encoder
  beta = 0.87 (N^4 M)^(-1/16), decoder beta = (12M)^(-1/4). The FFN and the attention initialise
  themselves (``init_weights(init)``), each weight drawn with ``init.generator(name)`` so the pairing holds;
  biases as the variant's ``init`` scheme draws them (``init.drawn(name)``).

The attention is plain scaled dot-product multi-head attention (four ``ctx.linear`` projections, heads
(B, H, L, d_k), the mask through ``ctx.mask.apply``, positions through ``ctx.positions``); it declares
nothing and must conform. The residual declares its difference from post-norm.

Expected: ``python -m harness --plugin tests/plugins/deepnet_plugin.py check --variants deepnet_plugin``
exits 0; the initial weights equal the built-in ``deepnet`` variant's (tests/test_init.py).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from harness import BuildContext, Component, Variant, hookimpl

NAME = "deepnet_plugin"


def alpha_beta(stack: str, n: int, m: int) -> tuple[float, float]:
    """(alpha, beta) of DeepNet's encoder-decoder (Table 1) for a block of ``stack``."""
    if stack == "decoder":
        return (3 * m) ** 0.25, (12 * m) ** -0.25
    return 0.81 * (n ** 4 * m) ** (1 / 16), 0.87 * (n ** 4 * m) ** (-1 / 16)


class DeepNormBlock(nn.Module):
    """``norm(alpha * x + dropout(sublayer(x)))``: post-norm with the residual scaled by alpha (B, L, D) -> (B, L, D)."""

    final_norm = False

    def __init__(self, ctx: BuildContext):
        super().__init__()
        self.norm = ctx.layer_norm()
        self.dropout = nn.Dropout(ctx.cfg.dropout)
        self.alpha = alpha_beta(ctx.stack, ctx.N, ctx.N)[0]

    def forward(self, x, sublayer):
        return self.norm(self.alpha * x + self.dropout(sublayer(x)))


def _start(layer: nn.Module, name: str, gain: float, init) -> None:
    """xavier_normal_(weight, gain) from the tensor's own generator; the bias as the variant's scheme draws it."""
    nn.init.xavier_normal_(layer.weight, gain=gain, generator=init.generator(f"{name}.weight"))
    if layer.bias is not None:
        layer.bias.copy_(init.drawn(f"{name}.bias"))


class BetaFFN(nn.Module):
    """``w_2(dropout(relu(w_1 x)))``, both matrices started with DeepNet's beta. (B, L, D) -> (B, L, D)."""

    def __init__(self, ctx: BuildContext):
        super().__init__()
        self.w_1 = ctx.linear(ctx.cfg.d_model, ctx.cfg.d_ff)
        self.w_2 = ctx.linear(ctx.cfg.d_ff, ctx.cfg.d_model)
        self.dropout = nn.Dropout(ctx.cfg.dropout)
        self.beta = alpha_beta(ctx.stack, ctx.N, ctx.N)[1]

    def forward(self, x):
        return self.w_2(self.dropout(torch.relu(self.w_1(x))))

    def init_weights(self, init):
        _start(self.w_1, "w_1", self.beta, init)
        _start(self.w_2, "w_2", self.beta, init)


class BetaAttention(nn.Module):
    """Multi-head attention; w_v and w_o started with gain beta, w_q and w_k with gain 1.

    Shape: query (B, Tq, D), key / value (B, Tk, D), mask from the mask component -> (B, Tq, D).
    """

    def __init__(self, ctx: BuildContext):
        super().__init__()
        d = ctx.cfg.d_model
        self.h, self.d_k = ctx.cfg.h, d // ctx.cfg.h
        self.w_q, self.w_k, self.w_v, self.w_o = (ctx.linear(d, d) for _ in range(4))
        self.mask, self.positions = ctx.mask, ctx.positions
        self.dropout = nn.Dropout(ctx.cfg.dropout)
        self.beta = alpha_beta(ctx.stack, ctx.N, ctx.N)[1]

    def _heads(self, x):
        b, length, _ = x.shape
        return x.view(b, length, self.h, self.d_k).transpose(1, 2)  # (B, L, D) -> (B, H, L, d_k)

    def forward(self, query, key, value, mask):
        q, k, v = self._heads(self.w_q(query)), self._heads(self.w_k(key)), self._heads(self.w_v(value))
        q, k = self.positions.rotate(q, k)
        scores = self.positions.bias(q @ k.transpose(-2, -1) / math.sqrt(self.d_k))  # (B, H, Tq, Tk)
        p = self.dropout(self.mask.apply(scores, mask).softmax(dim=-1))
        out = (p @ v).transpose(1, 2).reshape(query.size(0), query.size(1), -1)  # (B, Tq, D)
        return self.w_o(out)

    def init_weights(self, init):
        for name, gain in (("w_q", 1.0), ("w_k", 1.0), ("w_v", self.beta), ("w_o", self.beta)):
            _start(getattr(self, name), name, gain, init)


@hookimpl
def harness_add_components():
    source = "Wang et al. 2022 (DeepNet) Figure 2, Table 1 (test plugin)"
    return [
        Component(f"{NAME}_norm", "norm", DeepNormBlock, "LayerNorm(alpha x + sublayer(x))", source,
                  differs="DeepNorm: the residual scaled by alpha inside post-norm (Wang et al. 2022)"),
        Component(f"{NAME}_ffn", "feed_forward", BetaFFN, "ReLU FFN started with xavier_normal gain beta", source),
        Component(f"{NAME}_attn", "attention", BetaAttention,
                  "multi-head attention, w_v and w_o started with gain beta", source),
    ]


@hookimpl
def harness_add_variants():
    return [Variant(NAME, {"norm": f"{NAME}_norm", "feed_forward": f"{NAME}_ffn", "attention": f"{NAME}_attn"},
                    summary="baseline with DeepNet (DeepNorm residual, beta-scaled start) written as a plugin",
                    source="Wang et al. 2022 (test plugin)")]
