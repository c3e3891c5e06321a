"""Measurements at initialisation: what a trial whose spec carries ``measure`` runs instead of
training (:func:`harness.train.run_trial`), so measurement experiments go through the same
runner, executors, progress bars and store as training runs.

One kind so far, ``grad_norm_at_init`` (Xiong et al. 2020 §3.4): the gradient norm of one layer
parameter in every encoder and decoder layer, at initialisation. The experiment kind that plans,
stores and reports it lives in :mod:`harness.experiments.grad_norm`.
"""
from __future__ import annotations

from typing import Any

import torch

from .config import RunConfig
from .errors import ConfigError
from .tasks.base import loss_fn

#: The measurement kinds a trial spec's ``measure["kind"]`` may name.
KINDS = ("grad_norm_at_init",)


def measure_grad_norms(model, cfg: RunConfig, seed: int, batches: int, parameter: str, device,
                       task) -> dict[str, Any]:
    """Gradient norms at initialisation of ``parameter`` in every encoder and decoder layer.

    The loss is the training loss (label-smoothed cross-entropy, :func:`harness.tasks.base.loss_fn`)
    on ``batches`` mini-batches of ``task`` drawn from ``seed`` (the same stream the trial of that
    seed trains on); the gradient is averaged over the mini-batches (the expected gradient, Xiong
    et al. 2020 §3.4) and its Frobenius norm taken per layer.

    Returns:
        ``{"encoder": [norm per layer], "decoder": [norm per layer], "loss": mean loss}``.

    Raises:
        ConfigError: ``parameter`` is not a parameter of the layers.
    """
    tc, mc = cfg.train, cfg.model
    params = dict(model.named_parameters())
    names = {stack: [f"{stack}.layers.{i}.{parameter}" for i in range(mc.N)] for stack in ("encoder", "decoder")}
    missing = [n for ns in names.values() for n in ns if n not in params]
    if missing:
        layer = [n.split(".", 3)[3] for n in params if n.startswith("decoder.layers.0.")]
        raise ConfigError(f"measure.parameter {parameter!r} is not a layer parameter of this variant; "
                          f"expected one of {', '.join(layer)}")
    model.train()
    model.zero_grad(set_to_none=True)
    gen = torch.Generator().manual_seed(seed)
    total = 0.0
    for _ in range(batches):
        b = task.make_batch(tc.batch, tc.seq_len, mc.vocab, gen).to(device)
        loss = loss_fn(model(b.src, b.tgt), b.tgt_y, mc.pad, tc.label_smoothing) / batches
        loss.backward()
        total += float(loss.detach())
    return {stack: [float(params[n].grad.norm()) for n in ns] for stack, ns in names.items()} | {"loss": total}


def measure(model, cfg: RunConfig, seed: int, how: dict[str, Any], device, task) -> tuple[dict[str, Any], list[dict]]:
    """One measurement of ``model`` as a trial's ``(row, curve)``: for ``grad_norm_at_init``
    (``how = {"kind", "batches", "parameter"}``) the row holds ``N``, ``{enc,dec}_last``,
    ``{enc,dec}_first``, ``{enc,dec}_last_over_first`` and ``loss_at_init``; the curve one
    ``{"stack", "layer", "grad_norm"}`` row per layer and stack.

    Raises:
        ConfigError: an unknown kind or a bad parameter.
    """
    if how.get("kind") not in KINDS:
        raise ConfigError(f"measure kind {how.get('kind')!r}; expected one of {', '.join(KINDS)}")
    g = measure_grad_norms(model, cfg, seed, int(how["batches"]), str(how["parameter"]), device, task)
    row: dict[str, Any] = {"N": cfg.model.N}
    curve: list[dict] = []
    for stack in ("encoder", "decoder"):
        s = stack[:3]
        row[f"{s}_last"], row[f"{s}_first"] = g[stack][-1], g[stack][0]
        row[f"{s}_last_over_first"] = g[stack][-1] / g[stack][0] if g[stack][0] > 0 else float("nan")
        curve += [{"stack": stack, "layer": i, "grad_norm": x} for i, x in enumerate(g[stack])]
    row["loss_at_init"] = g["loss"]
    return row, curve
