"""The learning-rate schedules a trial trains with, as multipliers for ``torch.optim.lr_scheduler.LambdaLR``
(:func:`harness.recipe.make_optimizer`), and the absolute learning rate at a step (:func:`lr_at`), which the
vectorised trial group (:mod:`harness.group`) and the ``train/learning_rate`` curve (:mod:`harness.tboard`)
use, so that all three give the same number (``base * multiplier(step - 1)``, LambdaLR's own product).

Schedules (:data:`SCHEDULES`; ``t`` = the 1-based training step, T = ``train.steps``, W = ``train.warmup``):

- ``noam``: noam_factor * d_model^-0.5 * min(t^-0.5, t * W^-1.5), t counted from 1 as LambdaLR's step
  0 is read as 1 (Vaswani et al. 2017 §5.3; the Annotated Transformer's ``rate``). Its peak, at t = W,
  is noam_factor * d_model^-0.5 * W^-0.5; it never decays to zero.
- ``constant``: ``train.lr`` from step 1, no warm-up; with ``train.lr`` unset (None), noam_factor *
  d_model^-0.5, the meaning it had before ``train.lr`` existed (Xiong et al. 2020's no-warm-up arm).
- ``cosine``: lr * t / W for t <= W (linear warm-up), then min_lr + (lr - min_lr) * (1 + cos(pi p)) / 2
  with p = (t - W) / (T - W): min_lr at the last step (Loshchilov & Hutter 2017, SGDR, one cycle; the
  half-cosine of nanoGPT's ``get_lr``).
- ``linear``: the same warm-up, then min_lr + (lr - min_lr) * (1 - p).
- ``wsd``: warm-up, stable at lr, then a linear decay to min_lr over the last D = round(decay_fraction *
  T) steps (warm-up, stable, decay; Hägele et al. 2024, "Scaling Laws and Compute-Optimal Training
  Beyond Fixed Training Durations", whose cooldown matches a cosine run of the same length).

Imports nothing of the package (:mod:`harness.config` validates with it; :mod:`harness.train`,
:mod:`harness.group`, :mod:`harness.tboard` and the report use it). A ``train`` argument is anything
with :class:`harness.config.TrainConfig`'s attributes.
"""
from __future__ import annotations

import math
from typing import Any, Callable

#: schedule name -> what it does (``python -m harness list``, the settings' meaning, docs/running.md).
SCHEDULES: dict[str, str] = {
    "noam": "noam_factor * d_model^-0.5 * min(t^-0.5, t * warmup^-1.5): linear warm-up, then 1/sqrt(t); "
            "never decays to zero; takes train.noam_factor, not train.lr (Vaswani et al. 2017 §5.3)",
    "constant": "train.lr from step 1, no warm-up (train.lr unset: noam_factor * d_model^-0.5, its meaning "
                "before train.lr existed)",
    "cosine": "linear warm-up over train.warmup steps to train.lr, then a half cosine down to train.min_lr "
              "at the last step (Loshchilov & Hutter 2017; nanoGPT)",
    "linear": "linear warm-up over train.warmup steps to train.lr, then a straight line down to train.min_lr "
              "at the last step",
    "wsd": "warm-up, stable at train.lr, then a linear decay to train.min_lr over the last "
           "train.decay_fraction of the steps (Hägele et al. 2024)",
}
#: The schedules that warm up to ``train.lr`` and decay to ``train.min_lr``.
DECAYING = ("cosine", "linear", "wsd")
#: ``train.lr`` when unset, for ``cosine``, ``linear`` and ``wsd`` (``constant`` keeps its old meaning).
DEFAULT_LR = 1e-3


def noam_lambda(d_model: int, warmup: int, schedule: str = "noam") -> Callable[[int], float]:
    """The ``noam`` multiplier LambdaLR applies to noam_factor at scheduler step ``step`` (0-based):
    d_model^-0.5 * min(s^-0.5, s * warmup^-1.5) with s = max(step, 1) (Annotated ``rate``);
    ``schedule="constant"``: d_model^-0.5 at every step (``constant`` with ``train.lr`` unset)."""
    if schedule == "constant":
        return lambda step: d_model ** -0.5

    def rate(step: int) -> float:
        step = max(step, 1)
        return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)

    return rate


def decay_start(train: Any) -> int:
    """The last step before the decay of a decaying schedule: W for ``cosine`` and ``linear``; for
    ``wsd``, T - round(decay_fraction * T) (at least one decay step)."""
    if train.schedule == "wsd":
        return train.steps - max(1, round(train.decay_fraction * train.steps))
    return train.warmup


def warmup_decay(train: Any) -> Callable[[int], float]:
    """The multiplier of ``train.lr`` (scheduler step ``s``, 0-based; t = s + 1) for ``cosine``,
    ``linear`` and ``wsd``: t / W up to W, 1 until :func:`decay_start`, then down to min_lr / lr at
    t = T (held there after T). Raises ZeroDivisionError for lr = 0 (the config refuses it)."""
    w, last, start = train.warmup, train.steps, decay_start(train)
    low = train.min_lr / peak_of(train)
    shape = (lambda p: 0.5 * (1.0 + math.cos(math.pi * p))) if train.schedule == "cosine" else (lambda p: 1.0 - p)

    def mult(step: int) -> float:
        t = step + 1
        if t < w:
            return t / w
        if t <= start:
            return 1.0
        p = min(1.0, (t - start) / (last - start))
        return low + (1.0 - low) * shape(p)

    return mult


def peak_of(train: Any) -> float:
    """``train.lr``, or :data:`DEFAULT_LR` where it is unset (a decaying schedule's peak)."""
    return DEFAULT_LR if train.lr is None else train.lr


def base_and_multiplier(train: Any, d_model: int) -> tuple[float, Callable[[int], float]]:
    """``(base, multiplier)``: the optimiser's lr and LambdaLR's function of the 0-based scheduler
    step; the lr at 1-based step t is ``base * multiplier(t - 1)`` (see the module docstring)."""
    if train.schedule == "noam":
        return train.noam_factor, noam_lambda(d_model, train.warmup)
    if train.schedule == "constant":
        if train.lr is None:
            return train.noam_factor, noam_lambda(d_model, train.warmup, "constant")
        return train.lr, lambda step: 1.0
    return peak_of(train), warmup_decay(train)


def lr_at(train: Any, d_model: int) -> Callable[[int], float]:
    """The learning rate (Adam's step size) at 1-based training step t: the value LambdaLR sets
    before that step, bitwise (the same product)."""
    base, mult = base_and_multiplier(train, d_model)
    return lambda t: base * mult(t - 1)


def peak_lr(train: Any, d_model: int) -> float:
    """The largest learning rate of steps 1..T: for ``noam``, noam_factor * d_model^-0.5 *
    min(s^-0.5, s * W^-1.5) at s = min(T, W); for every other schedule its peak (lr, or the old
    ``constant`` rate)."""
    if train.schedule == "noam":
        return lr_at(train, d_model)(min(train.steps, train.warmup) + 1)
    if train.schedule == "constant":
        return lr_at(train, d_model)(1)
    return peak_of(train)
