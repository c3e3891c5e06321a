"""What every model-level property measures with: the result record, logits in a probe's mode, the seeded RNG,
the first module whose output is non-finite, ids that differ everywhere, the causes a leak can have.

Shape letters: B batch, S source length, T target length, V vocabulary.

Eval mode runs under ``torch.inference_mode`` (as evaluation does); train mode runs with autograd on and the RNG
re-seeded before every forward, so dropout drops the same units in both forwards (probes that change shapes run in
eval mode only). A model that behaves differently when it detects a probe must therefore behave differently in
training or in evaluation too.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
from torch import nn

from ...config import ModelConfig
from ..inputs import autocast, non_pad


@dataclass
class ProbeResult:
    """One probe on one variant: the largest change where nothing may change."""

    subject: str
    probe: str
    mode: str
    passed: bool
    max_change: float
    threshold: float
    detail: str = ""


@contextlib.contextmanager
def seeded_rng(seed: int | None, device: torch.device):
    if seed is None:
        yield
        return
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def probe_logits(model, src, tgt, masks, device, dtype, mode: str, seed: int) -> torch.Tensor:
    """Logits (B, T, V) as float64 on the CPU, in ``mode`` (see the module docstring)."""
    guard = torch.inference_mode() if mode == "eval" else torch.enable_grad()
    with guard, autocast(device, dtype), seeded_rng(seed if mode == "train" else None, device):
        out = model(src, tgt, *masks) if masks is not None else model(src, tgt)
    return out.detach().to("cpu", torch.float64)


def non_finite_result(probe: str, name: str, mode: str, base: torch.Tensor, real: torch.Tensor,
                threshold: float, model: nn.Module) -> ProbeResult | None:
    """A failed ``probe`` that names the non-finite output when the unchanged forward's logits ``base`` (B, T, V) are
    NaN or inf at the ``real`` (B, T) target positions (no change can be measured then, and a leak would be the
    wrong name), with ``model`` put back in evaluation mode; None when they are finite."""
    if bool(torch.isfinite(base[real]).all()):
        return None
    model.eval()
    return ProbeResult(name, probe, mode, False, math.inf, threshold, (
        f"non-finite output in {'training' if mode == 'train' else 'evaluation'} mode: the logits at real target "
        f"positions are NaN or inf before anything is changed, so this probe cannot measure a change (the 'finite' "
        f"probe names the first module whose output is non-finite)"))


def first_non_finite(model: nn.Module, run) -> str:
    """The first module, in the order modules finish their forward, whose output holds a NaN or inf during
    ``run()`` (the innermost culprit: a module finishes after its children), as ``"name (Class)"``; "" if none."""
    found: list[str] = []
    names = {m: n for n, m in model.named_modules()}

    def hook(module, _inputs, out):
        if not found and isinstance(out, torch.Tensor) and out.is_floating_point() and not torch.isfinite(out).all():
            found.append(f"{names.get(module) or 'the model'} ({type(module).__name__})")

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return found[0] if found else ""


def other_ids(ids: torch.Tensor, cfg: ModelConfig, g: torch.Generator) -> torch.Tensor:
    """Non-pad ids that differ from ``ids`` at every position (same shape)."""
    cand = non_pad(ids.shape, cfg, g).to(ids.device)
    shifted = (cand + 1) % cfg.vocab
    shifted = torch.where(shifted == cfg.pad, (shifted + 1) % cfg.vocab, shifted)
    return torch.where(cand == ids, shifted, cand)


def batch_statistics(model: nn.Module, mode: str, prefer: str = "") -> str:
    """In train mode, the cause a leak has when the model holds BatchNorm modules (their training
    statistics run over every row and position of the batch, so one position's output depends on the
    others'): a phrase naming them (first one whose name starts with ``prefer``); "" in eval mode or
    without such modules."""
    names = [n for n, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    names.sort(key=lambda n: not n.startswith(prefer))
    if mode != "train" or not names:
        return ""
    return (f"through the batch statistics of its {len(names)} BatchNorm module(s) (e.g. {names[0]}), which "
            f"normalise each feature over every position and row of the batch in training")



#: A leak's cause when the probe leaks in train mode only (its eval-mode run passed) and no BatchNorm is in sight.
TRAIN_ONLY = ("in training only (the evaluation-mode probe passes): something that runs only in training mixes "
              "positions, such as a mask skipped in training or statistics over the batch")

