"""The training recipe around the model: the optimiser, its parameter groups and the schedule, for the
sequential training loop (:func:`make_optimizer`) and the vectorised trial group (:func:`group_step`),
from one config so that both train with the same recipe.

- ``adam``: ``torch.optim.Adam(betas=(0.9, 0.98), eps=1e-9)`` on every parameter, one parameter
  group (Vaswani et al. 2017 §5.3).
- ``adamw``: ``torch.optim.AdamW`` with the same betas and eps and decoupled weight decay lambda =
  ``TrainConfig.decay()`` (Loshchilov & Hutter 2019: p <- p - lr * lambda * p, then the Adam step).
  Two parameter groups: the decayed ones (lambda) and the rest (0), by :func:`decayed_names`.
- the schedule: ``LambdaLR`` with :func:`harness.schedule.base_and_multiplier` (formulas in
  :mod:`harness.schedule`).

Which parameters decay (:func:`decayed_names`): every parameter when ``train.decay_all``; otherwise a
weight with two or more dimensions that is not an embedding. Biases and norm gains (1-D) are not
decayed (nanoGPT's ``configure_optimizers``; timm's ``param_groups_weight_decay``), and neither are
embeddings (minGPT's rule; nanoGPT decays its embeddings): the weight of any ``nn.Embedding``, the
source and target tables of the ``embedding`` slot (its canonical ``src.weight`` and ``tgt.weight``:
a tied matrix is an embedding, so it is not decayed as the generator either) and every parameter of
the ``positional`` slot's modules (learned position tables).
"""
from __future__ import annotations

import torch
from torch import nn

from .config import RunConfig, TrainConfig
from .schedule import base_and_multiplier
from .vstep import BETAS, EPS, GroupStep


def _embedding_ids(model: nn.Module) -> set[int]:
    """``id`` of every embedding parameter of ``model`` (see the module docstring)."""
    ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    embed = getattr(model, "embed", None)
    state = embed.canonical_state() if hasattr(embed, "canonical_state") else {}
    for name in ("src.weight", "tgt.weight"):
        t = state.get(name)
        if isinstance(t, torch.Tensor):
            ids.add(id(t if isinstance(t, nn.Parameter) else t._base))
    for attr in ("src_pos", "tgt_pos"):
        pos = getattr(model, attr, None)
        if isinstance(pos, nn.Module):
            ids |= {id(p) for p in pos.parameters()}
    return ids


def decayed_names(model: nn.Module, tc: TrainConfig) -> set[str]:
    """The names (``model.named_parameters()``, trainable ones) that weight decay applies to: none for
    ``adam`` or a lambda of 0; every one with ``decay_all``; else the >= 2-D non-embedding weights."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if tc.optimizer != "adamw" or not tc.decay():
        return set()
    if tc.decay_all:
        return {n for n, _ in named}
    embeddings = _embedding_ids(model)
    return {n for n, p in named if p.ndim >= 2 and id(p) not in embeddings}


def param_groups(model: nn.Module, tc: TrainConfig) -> list[dict]:
    """``torch.optim`` parameter groups: ``adam`` one group of every parameter; ``adamw`` the decayed
    parameters with ``weight_decay`` = lambda and the others with 0 (an empty group left out)."""
    params = list(model.parameters())
    if tc.optimizer != "adamw":
        return [{"params": params}]
    decayed = decayed_names(model, tc)
    named = list(model.named_parameters())
    groups = [{"params": [p for n, p in named if n in decayed], "weight_decay": tc.decay()},
              {"params": [p for n, p in named if n not in decayed], "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def make_optimizer(model: nn.Module, cfg: RunConfig):
    """``(optimizer, scheduler)``: ``train.optimizer`` (Adam or AdamW, betas (0.9, 0.98), eps 1e-9) over
    :func:`param_groups` and ``LambdaLR`` with the schedule of ``cfg`` (:mod:`harness.schedule`).

    Uses ``fused=True`` (one kernel per parameter; on CPU 2x faster than ``foreach``) and
    falls back to ``foreach=True`` where the device or a parameter's dtype has no fused kernel.
    """
    tc = cfg.train
    base, multiplier = base_and_multiplier(tc, cfg.model.d_model)
    cls = torch.optim.AdamW if tc.optimizer == "adamw" else torch.optim.Adam
    kwargs = dict(lr=base, betas=BETAS, eps=EPS, weight_decay=0.0)  # LambdaLR multiplies lr by the schedule
    try:
        opt = cls(param_groups(model, tc), fused=True, **kwargs)
    except (RuntimeError, ValueError):  # no fused kernel for this device / dtype
        opt = cls(param_groups(model, tc), foreach=True, **kwargs)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, multiplier)


def group_step(models: list[nn.Module], cfg: RunConfig, device: torch.device, dtype: str = "fp32") -> GroupStep:
    """The :class:`harness.vstep.GroupStep` of K models of one variant with ``cfg``'s recipe: its loss
    settings, gradient clipping and the same decoupled weight decay on the same parameters as
    :func:`make_optimizer` (the learning rate is set each step from :func:`harness.schedule.lr_at`)."""
    tc = cfg.train
    return GroupStep(models, cfg.model.pad, tc.label_smoothing, tc.grad_clip, device, dtype,
                     weight_decay=tc.decay() if tc.optimizer == "adamw" else 0.0,
                     decayed=decayed_names(models[0], tc))
