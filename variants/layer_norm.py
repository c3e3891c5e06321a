"""Slot ``layer_norm``: the LayerNorm formula.

* ``torch``: ``nn.LayerNorm(D)`` -- biased variance, eps = 1e-5 inside the square root
  (Ba et al. 2016; d2l §10.7, note 004).
* ``annotated``: a_2 * (x - mean) / (std + eps) + b_2 with the *unbiased* std and eps = 1e-6
  added outside the square root -- the Annotated Transformer's ``LayerNorm`` (notes 000, 002).
  Differs from ``torch`` by a relative ~1 - sqrt((D-1)/D) (9.8e-4 at D = 512).
* ``unbiased_var``: (x - mean) / sqrt(var_unbiased + eps) with eps = 1e-6 -- note 001's
  hand-written LayerNorm (its printout -1.2649 for the row 0..4 confirms the unbiased variance).

* ``rmsnorm``: x / sqrt(mean(x^2) + eps) * weight with eps = 1e-6 -- RMSNorm (Zhang & Sennrich
  2019, eq. 4): no mean subtraction, no bias (LLaMA's ``RMSNorm``).

* ``batchnorm``: ``nn.BatchNorm1d(D)`` over every (batch, position) row, padded positions
  included: in training each feature is normalised with the mean and biased variance of the whole
  batch's B * L rows (eps = 1e-5, Ioffe & Szegedy 2015), running averages (momentum 0.1) in
  evaluation. What notes 000, 002 and d2l §10.7.3 (note 003) compare LayerNorm with and reject
  ("why LayerNorm and not BatchNorm?"); in the group ``questions`` only, as its one variant
  ``batchnorm`` shows: its training statistics mix positions, so the decoder's see the future
  and the encoder's the padding, which the model-level probes flag (docs/seeds.md).

All but ``rmsnorm`` expose canonical parameters ``weight`` and ``bias`` of shape (D,); ``rmsnorm``
exports ``weight`` only (it has no bias).
"""
from __future__ import annotations

import torch
from torch import nn

from harness import Component, hookimpl


class AnnotatedLayerNorm(nn.Module):
    """Annotated Transformer LayerNorm: unbiased std, eps outside the sqrt. Shape (..., D) -> (..., D)."""

    def __init__(self, features: int, eps: float = 1e-6):
        super().__init__()
        self.a_2 = nn.Parameter(torch.ones(features))
        self.b_2 = nn.Parameter(torch.zeros(features))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        std = x.std(-1, keepdim=True)
        return self.a_2 * (x - mean) / (std + self.eps) + self.b_2

    def canonical_state(self):
        return {"weight": self.a_2, "bias": self.b_2}

    def load_canonical_state(self, state):
        with torch.no_grad():
            self.a_2.copy_(state["weight"])
            self.b_2.copy_(state["bias"])
        return []


class UnbiasedVarLayerNorm(AnnotatedLayerNorm):
    """Note 001's LayerNorm: unbiased variance, eps inside the sqrt. Shape (..., D) -> (..., D)."""

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = x.var(-1, keepdim=True)
        return self.a_2 * (x - mean) / torch.sqrt(var + self.eps) + self.b_2


class RMSNorm(nn.Module):
    """RMSNorm (Zhang & Sennrich 2019): x * rsqrt(mean(x^2) + eps) * weight. Shape (..., D) -> (..., D)."""

    def __init__(self, features: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(features))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class TokenBatchNorm(nn.BatchNorm1d):
    """``nn.BatchNorm1d(D)`` applied to every token: (..., D) is flattened to (rows, D), so the
    statistics of each feature run over the batch and every position (padding included).
    Shape (..., D) -> (..., D); parameters ``weight``, ``bias`` (D,); buffers ``running_mean``,
    ``running_var`` (D,) updated in training (momentum 0.1)."""

    def __init__(self, features: int):
        super().__init__(features)

    def forward(self, x):
        return super().forward(x.reshape(-1, x.size(-1))).view(x.shape)


@hookimpl
def harness_add_components():
    return [
        Component("torch", "layer_norm", lambda ctx: nn.LayerNorm(ctx.cfg.d_model),
                  "nn.LayerNorm: biased variance, eps=1e-5 inside sqrt", "Ba et al. 2016; d2l §10.7; note 004",
                  default=True),
        Component("annotated", "layer_norm", lambda ctx: AnnotatedLayerNorm(ctx.cfg.d_model),
                  "unbiased std, eps=1e-6 added outside sqrt", "Annotated Transformer LayerNorm; notes 000, 002",
                  differs="unbiased std (n - 1) with eps = 1e-6 added outside the square root, as the Annotated "
                          "Transformer's LayerNorm (notes 000, 002); nn.LayerNorm uses the biased variance"),
        Component("unbiased_var", "layer_norm", lambda ctx: UnbiasedVarLayerNorm(ctx.cfg.d_model),
                  "unbiased variance, eps=1e-6 inside sqrt", "note 001 LayerNorm",
                  differs="unbiased variance (n - 1), eps = 1e-6 inside the square root (note 001's LayerNorm)"),
        Component("rmsnorm", "layer_norm", lambda ctx: RMSNorm(ctx.cfg.d_model),
                  "x / sqrt(mean(x^2) + 1e-6) * weight: no mean subtraction, no bias", "Zhang & Sennrich 2019; LLaMA",
                  differs="RMSNorm: no mean subtraction and no bias, eps = 1e-6 (Zhang & Sennrich 2019)",
                  reference="rms_norm"),
        Component("batchnorm", "layer_norm", lambda ctx: TokenBatchNorm(ctx.cfg.d_model),
                  "nn.BatchNorm1d over the batch's tokens: per-feature batch statistics in training, running ones "
                  "in evaluation", "Ioffe & Szegedy 2015; d2l §10.7.3 (note 003), notes 000 and 002 ask why not",
                  differs="BatchNorm: each feature normalised over the batch's B * L rows (padding included) "
                          "in training, with running averages in evaluation, where LayerNorm normalises each "
                          "row over d_model (Ioffe & Szegedy 2015)",
                  reference="batch_norm"),
    ]
