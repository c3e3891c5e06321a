"""The padding properties: the tokens behind the source padding mask (:func:`probe_masked_keys`) and extra pad
tokens appended to the source (:func:`probe_extra_padding`) never move a real target position's logits (encoder
self-attention and cross-attention; the padding mask of Vaswani et al. 2017, d2l §10.7.2)."""
from __future__ import annotations

import math

import torch
from torch import nn

from ...config import ModelConfig
from ..inputs import fmt_size
from .measure import TRAIN_ONLY, ProbeResult, batch_statistics, non_finite_result, other_ids, probe_logits


def probe_masked_keys(model: nn.Module, batch, cfg: ModelConfig, threshold: float, mode: str = "eval", *,
                      device: torch.device | str = "cpu", dtype: str = "fp32", seed: int = 0,
                      name: str = "", eval_passed: bool = False) -> ProbeResult:
    """Change the tokens at padded source positions, keeping the masks made from the original batch;
    logits at real target positions must not move (encoder self-attention and cross-attention).
    ``eval_passed``: as :func:`probe_causal`'s."""
    device = torch.device(device)
    src, tgt = batch[0].to(device), batch[1].to(device)
    real = batch[1] != cfg.pad
    model.train(mode == "train")
    masks = model.make_masks(src, tgt)
    base = probe_logits(model, src, tgt, masks, device, dtype, mode, seed)
    if (bad := non_finite_result("masked source keys", name, mode, base, real, threshold, model)) is not None:
        return bad
    changed = src.clone()
    padded = src == cfg.pad
    changed[padded] = other_ids(src, cfg, torch.Generator().manual_seed(seed + 29))[padded]
    out = probe_logits(model, changed, tgt, masks, device, dtype, mode, seed)
    model.eval()
    d = torch.nan_to_num((out - base).abs(), nan=math.inf).masked_fill(~real[..., None], 0.0)
    worst = float(d.max())
    detail = ""
    if worst > threshold:
        stats = batch_statistics(model, mode)
        cause = (f"the padding reaches them {stats}" if stats else TRAIN_ONLY if mode == "train" and eval_passed
                 else "source padding mask not applied")
        detail = (f"real target positions changed (max |Δ logit| {fmt_size(worst)}) when the tokens at padded "
                  f"source positions changed, masks unchanged ({mode} mode): {cause}")
    return ProbeResult(name, "masked source keys", mode, worst <= threshold, worst, threshold, detail)


def probe_extra_padding(model: nn.Module, batch, cfg: ModelConfig, threshold: float, *,
                        device: torch.device | str = "cpu", dtype: str = "fp32", extra: int = 3,
                        name: str = "") -> ProbeResult:
    """Append ``extra`` pad tokens to every source row (masks made from the ids); logits at real target
    positions must not move. Eval mode (the shapes change, so dropout draws would differ)."""
    device = torch.device(device)
    src, tgt = batch[0].to(device), batch[1].to(device)
    real = batch[1] != cfg.pad
    if src.size(1) + extra > cfg.max_len:
        extra = max(0, cfg.max_len - src.size(1))
    model.eval()
    base = probe_logits(model, src, tgt, None, device, dtype, "eval", 0)
    longer = torch.cat([src, torch.full((src.size(0), extra), cfg.pad, dtype=src.dtype, device=device)], dim=1)
    out = probe_logits(model, longer, tgt, None, device, dtype, "eval", 0)
    d = torch.nan_to_num((out - base).abs(), nan=math.inf).masked_fill(~real[..., None], 0.0)
    worst = float(d.max())
    detail = "" if worst <= threshold else (
        f"real target positions changed (max |Δ logit| {fmt_size(worst)}) when {extra} pad tokens were appended to the "
        f"source (eval mode): padded source keys are attended to (source padding ignored)")
    return ProbeResult(name, "extra source padding", "eval", worst <= threshold, worst, threshold, detail)

