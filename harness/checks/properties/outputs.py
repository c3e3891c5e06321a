"""The output properties: prefix-only logits equal the whole-target forward's (:func:`probe_prefix`: held-out
positions are scored from prefixes, harness.tasks.base.prefix_logits) and outputs and gradients are finite on a
padded batch (:func:`probe_finite`)."""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from ...config import ModelConfig
from ..inputs import autocast, fmt_size
from .measure import ProbeResult, first_non_finite, probe_logits


def probe_prefix(model: nn.Module, batch, cfg: ModelConfig, threshold: float, *,
                 device: torch.device | str = "cpu", dtype: str = "fp32", name: str = "",
                 causal_passed: bool = True) -> ProbeResult:
    """Prefix = whole target, eval mode: for every target position t, the logits at t from a forward whose
    decoder input is the prefix ``tgt[:, :t + 1]`` (width t + 1: how held-out positions are scored,
    :func:`harness.tasks.base.prefix_logits`) must equal the whole-target forward's at real positions.
    Every other probe keeps the target's width, so a component that reads the decoder input's width (a
    branch on a single query, a scale by the length) passed them, trained as one function and was scored
    as another (``tests/plugins/adv_single_query_scale.py``). One forward per position, every row in each.
    ``causal_passed``: the eval-mode causal probe passed (else a gap is named as that leak: the whole-target
    forward sees later tokens)."""
    device = torch.device(device)
    src, tgt = batch[0].to(device), batch[1].to(device)
    real = batch[1] != cfg.pad  # (B, T)
    model.eval()
    base = probe_logits(model, src, tgt, None, device, dtype, "eval", 0)  # (B, T, V)
    worst, first = 0.0, None
    for t in range(tgt.size(1)):
        if not bool(real[:, t].any()):
            continue
        out = probe_logits(model, src, tgt[:, :t + 1], None, device, dtype, "eval", 0)[:, t]  # (B, V)
        d = float(torch.nan_to_num((out - base[:, t]).abs(), nan=math.inf)[real[:, t]].max())
        worst = max(worst, d)
        if d > threshold and first is None:
            first = (t, d)
    detail = "" if first is None else (
        f"the logits at target position {first[0]} from a decoder input that ends there (width {first[0] + 1}, "
        f"how held-out positions are scored) differ from the whole-target forward's by {fmt_size(first[1])} (eval "
        f"mode): " + ("an output depends on the decoder input's width (e.g. a branch on a single query, a scale by "
                      "the length), so the model trains as one function and is scored as another" if causal_passed else
                      "the whole-target forward sees later target tokens (the causal leak above)"))
    return ProbeResult(name, "prefix = whole target", "eval", first is None, worst, threshold, detail)


def probe_finite(model: nn.Module, batch, cfg: ModelConfig, *, device: torch.device | str = "cpu",
                 dtype: str = "fp32", name: str = "") -> ProbeResult:
    """Logits at real target positions and every parameter's gradient of the cross-entropy over real
    positions must be finite on a padded batch (train mode). Gradients are cleared afterwards."""
    device = torch.device(device)
    src, tgt, labels = (t.to(device) for t in batch)
    real = tgt != cfg.pad
    model.train()
    model.zero_grad(set_to_none=True)
    with torch.enable_grad(), autocast(device, dtype):
        logits = model(src, tgt)
        loss = F.cross_entropy(logits[real].float(), labels[real])
    detail = ""
    if not torch.isfinite(logits[real]).all():
        with torch.no_grad(), autocast(device, dtype):
            where = first_non_finite(model, lambda: model(src, tgt))
        detail = ("non-finite output in training mode: logits at real target positions are NaN or inf on a padded "
                  "batch" + (f"; first non-finite output: {where}" if where else ""))
    else:
        loss.backward()
        bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
        if bad:
            where = "" if torch.isfinite(logits).all() else " (the logits at padded positions are NaN: " \
                                                            "a fully masked row there reaches the gradients)"
            detail = f"non-finite gradient in {len(bad)} parameter(s), e.g. {bad[0]}, on a padded batch{where}"
    model.zero_grad(set_to_none=True)
    model.eval()
    return ProbeResult(name, "finite", "train", not detail, 0.0 if not detail else math.inf, 0.0, detail)

