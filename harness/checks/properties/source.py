"""The source property of one-stack models: no source position's state depends on the target
(:func:`probe_source_blind`). In a decoder-only model the source comes first and the mask is causal; in a prefix LM
the source attends bidirectionally inside itself but never to a target key (Raffel et al. 2020 §3.2.1, Fig. 3). A
prefix mask that lets the source see the target leaks the future into every target position through the source's
keys and values; this property names that fault where the causal probe sees only its effect."""
from __future__ import annotations

import math

import torch
from torch import nn

from ...config import ModelConfig
from ...decoder_only import pack
from ..inputs import autocast, fmt_size
from .measure import ProbeResult, other_ids


def source_states(model: nn.Module, src: torch.Tensor, tgt: torch.Tensor, device, dtype: str) -> torch.Tensor:
    """The stack's output at the packed source positions, eval mode, as float64 on the CPU.

    Shape: src (B, S), tgt (B, T) -> (B, S, D) (positions past a row's source hold whatever the stack made there:
    compare them only where ``src != pad``)."""
    with torch.inference_mode(), autocast(device, dtype):
        ids, x, n, _ = pack(src, tgt, model.embed.src(src), model.embed.tgt(tgt), model.cfg.pad)
        h = model.decoder(model.tgt_pos(x), model.sequence_mask(ids, n))  # (B, S + T, D)
    return h[:, :src.size(1)].detach().to("cpu", torch.float64)


def probe_source_blind(model: nn.Module, batch, cfg: ModelConfig, threshold: float, *,
                       device: torch.device | str = "cpu", dtype: str = "fp32", seed: int = 0,
                       name: str = "") -> ProbeResult:
    """Redraw every target token after the start symbol (eval mode); the stack's output at every real source
    position must not move. Applies to decoder-only and prefix-LM models (:mod:`harness.decoder_only`)."""
    device = torch.device(device)
    src, tgt = batch[0].to(device), batch[1].to(device)
    model.eval()
    base = source_states(model, src, tgt, device, dtype)
    changed = tgt.clone()
    redrawn = other_ids(tgt, cfg, torch.Generator().manual_seed(seed + 41))
    changed[:, 1:] = torch.where(tgt[:, 1:] != cfg.pad, redrawn[:, 1:], tgt[:, 1:])
    out = source_states(model, src, changed, device, dtype)
    real = (src != cfg.pad).cpu()
    d = torch.nan_to_num((out - base).abs(), nan=math.inf).masked_fill(~real[..., None], 0.0)
    worst = float(d.max())
    detail = "" if worst <= threshold else (
        f"source positions changed (max |Δ state| {fmt_size(worst)}) when the target tokens changed (eval mode): a "
        f"source position sees the target (the {getattr(model, 'architecture', '?')} mask lets the source attend to "
        f"target keys, so every target position reads later target tokens through the source)")
    return ProbeResult(name, "source sees target", "eval", worst <= threshold, worst, threshold, detail)
