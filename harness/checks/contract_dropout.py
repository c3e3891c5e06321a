"""Dropout must be unbiased: the part of the attention and feed-forward contracts that looks at training mode
with dropout on.

Every other comparison runs with dropout off (evaluation mode, or dropout 0 in the training = evaluation item), so
a component whose dropout changes the expected output -- a mask without the 1 / (1 - p) rescale, the rescale
applied twice, dropout on the scores before the softmax -- passes them and trains as another function than the
one classed "same function" whenever the config's dropout is above 0 (the paper and g2p_long presets). Inverted
dropout (Srivastava et al. 2014, as ``nn.Dropout`` implements it) placed where the output is linear in the dropped
tensor (the attention weights after the softmax, the FFN's hidden layer, a sub-layer's output) leaves the expected
output equal to the evaluation-mode one.

Test: built at p = :data:`DROPOUT_P` (whatever the config's dropout), float64, random canonical weights, the mean of
:data:`DRAWS` training-mode forwards against the training-mode output of the same component built with dropout 0
(which the training = evaluation item holds to the evaluation output), summarised as the relative bias
b = sum((mean - want) * want) / sum(want^2): 0 up to sampling noise for unbiased dropout, -p without the rescale,
1 / (1 - p) - 1 = +1 with the rescale applied twice. Fails when |b| >
:data:`harness.checks.policy.DROPOUT_MAX_BIAS`.

Shape letters: B batch, T length, D = d_model.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from ..config import ModelConfig
from ..registry import Component
from .contract_base import CONFORMS, VIOLATES, ComponentResult, component_result, crash_result, load_random_state, \
    reference_components, sibling_context
from .inputs import padded_batch
from .policy import DROPOUT_MAX_BIAS

#: The dropout probability the test builds every component with, and the number of training-mode draws.
DROPOUT_P = 0.5
DRAWS = 128

def check_dropout(comp: Component, cfg: ModelConfig, seed: int, kind: str) -> list[ComponentResult]:
    """One result: the dropout of ``comp``, checked as a component of ``kind`` (``"attention"`` or
    ``"feed_forward"``: :func:`~harness.checks.contract_attention.check_attention` and
    :func:`~harness.checks.contract_positions.check_feed_forward` call it, also for a plugin's slot that names
    them), is unbiased (module docstring). A crash is a failing result."""
    cfg = dataclasses.replace(cfg, dropout=DROPOUT_P)
    label = f"dropout unbiased (mean of {DRAWS} training forwards at p = {DROPOUT_P} vs p = 0)"
    try:
        bias = _relative_bias(comp, cfg, seed, kind)
    except Exception as exc:  # noqa: BLE001 - a crash is a result
        return [crash_result(comp, label, exc)]
    if abs(bias) <= DROPOUT_MAX_BIAS:
        return [component_result(comp, label, CONFORMS, True, abs(bias), DROPOUT_MAX_BIAS)]
    if not math.isfinite(bias):
        return [component_result(comp, label, VIOLATES, False, math.inf, DROPOUT_MAX_BIAS, diagnosis=(
            f"non-finite output in training mode: the {kind} component's training-mode output (dropout p = "
            f"{DROPOUT_P} or 0) holds NaN or inf, while every check in evaluation mode saw finite outputs"))]
    return [component_result(comp, label, VIOLATES, False, abs(bias), DROPOUT_MAX_BIAS, diagnosis=(
        f"with dropout on, the mean training output is {1 + bias:.2f} x the output without dropout (unbiased dropout: "
        f"1.00; {1 - DROPOUT_P:.2f} when the 1 / (1 - p) rescale is missing, {1 / (1 - DROPOUT_P):.2f} when it is "
        f"applied twice): the component trains as another function than every check (dropout off) saw"))]


def _relative_bias(comp: Component, cfg: ModelConfig, seed: int, kind: str) -> float:
    """b = sum((mean - want) * want) / sum(want^2) of the component's output (module docstring), ``want`` the
    training-mode output of the same component built with dropout 0: a difference between training and
    evaluation that is not dropout's is the training = evaluation item's to name, not this one's."""
    src, tgt, _ = padded_batch(cfg, seed=seed)
    g = torch.Generator().manual_seed(seed + 113)
    x = torch.randn(src.size(0), tgt.size(1), cfg.d_model, generator=g).double()  # (B, T, D)

    def build(p: float):
        ctx = sibling_context(dataclasses.replace(cfg, dropout=p), reference_components(**{kind: comp}))
        mod = ctx.attention(cross=False) if kind == "attention" else comp.factory(ctx)
        load_random_state(mod, seed)
        mod = mod.double().train()
        if kind == "attention":
            mask = ctx.make("mask").tgt_mask(tgt, cfg.pad)
            return lambda: mod(x, x, x, mask)
        return lambda: mod(x)

    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(seed + 127)
        want = build(0.0)()
        run = build(cfg.dropout)
        mean = sum(run() for _ in range(DRAWS)) / DRAWS
    real = (tgt != cfg.pad)[..., None]  # (B, T, 1): padded query rows are never scored
    want, mean = want * real, mean * real
    return float(((mean - want) * want).sum() / (want * want).sum().clamp_min(1e-300))
