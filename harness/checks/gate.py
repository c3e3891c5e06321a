"""The run gate: what a trial checks of its variant before it trains (``run``; the vectorised
trial groups of :mod:`harness.group` run the same checks for each seed).

- :func:`contract_reasons`: every component of the variant against its slot's contract
  (:mod:`harness.checks.contracts`) with the trial's model config, cached per process.
- :func:`drift_reasons` (after training): a fresh build holding the trained parameters must compute what the
  trained model computes, so a component that changes with use (a call counter, a cache kept between batches)
  is not scored as the function the checks saw at its first calls.
- :func:`twin_reasons`: a second build from the same seed must be the same model (module tree,
  weights, eval-mode logits on the gate's batch), so a factory cannot show the contract check
  one object and the trial another; and (:func:`modes_reasons`, cached per process like the contracts)
  with dropout 0 its training forward and gradients must be its evaluation ones, since every check
  compares evaluation-mode outputs.

A variant with any reason is trained all the same and stored with status ``invalid``
(:data:`harness.train.INVALID`), so no report ranks it. The probes run at initialisation and after
training (causality, padding, finite gradients) are :func:`harness.checks.properties.trial_rows.integrity_reasons`; each
function here is the measure of one row of :data:`harness.checks.properties.table.PROPERTIES`, and
:class:`harness.trialgate.TrialGate` runs them.
"""
from __future__ import annotations

from typing import Any

import torch

from ..model import build_model
from ..registry import Variant


_CONTRACTS: dict[tuple, tuple[Any, list[str]]] = {}  # key -> (the registry checked, reasons)


def contract_reasons(registry, variant: Variant, model_cfg) -> list[str]:
    """One line per component of ``variant`` that breaks its slot's contract (an undeclared
    difference from the slot's reference, see :mod:`harness.checks.contracts`), checked with the trial's
    model config; cached per process. Declared differences pass; declared bugs are reported."""
    from .contracts import check_contracts

    out = []
    for slot, name in sorted(variant.resolved().items()):
        key = (slot, name, id(registry), repr(model_cfg))
        held = _CONTRACTS.get(key)
        if held is None or held[0] is not registry:  # an id is reused once its registry is freed
            held = _CONTRACTS[key] = (registry, [r.reason() for r in
                                                 check_contracts(registry, [(slot, name)], model_cfg) if not r.ok])
        out += [f"contract: {line}" for line in held[1]]
    return out


def twin_reasons(registry, variant: Variant, model_cfg, seed: int, model, device, dtype: str = "fp32") -> list[str]:
    """A second build of ``variant`` from the same seed must be the same model as ``model``: the
    same module tree (names and classes, the mask style's class included), the same weights and
    the same eval-mode logits on the run gate's batch (within the gate's threshold). A component
    factory that returns something else on another call -- an honest object to the contract check,
    another one to the trial -- fails; one line per difference found first (empty: the same)."""
    from .properties.rows import gate_batch

    twin = build_model(registry, variant, model_cfg, seed=seed).to(device)

    def tree(m):
        return [(n, type(x).__module__, type(x).__qualname__) for n, x in m.named_modules()] + \
            [("mask_style", type(m.mask_style).__module__, type(m.mask_style).__qualname__)]

    what = "two builds of the variant from seed %d differ in their %%s: a component's factory does not " \
           "return the same thing on every call" % seed
    if tree(model) != tree(twin):
        return [f"build: {what % 'module tree (names, classes)'}"]
    mine, theirs = model.state_dict(), twin.state_dict()
    if mine.keys() != theirs.keys() or any(not torch.equal(mine[k], theirs[k]) for k in mine):
        return [f"build: {what % 'weights'}"]
    src, tgt, _ = gate_batch(model_cfg, seed=seed)
    was_training = model.training
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.inference_mode():
        model.eval()
        twin.eval()
        a, b = model(src.to(device), tgt.to(device)).float(), twin(src.to(device), tgt.to(device)).float()
    model.train(was_training)
    if not _same(a, b):
        return [f"build: {what % 'outputs (eval mode, same weights, same batch)'}"]
    return []


_CACHE: dict[tuple, tuple[Any, list[str]]] = {}  # (kind, key) -> (the registry checked, the lines)


def cached_reasons(kind: str, registry, variant: Variant, model_cfg, device, dtype: str, measure) -> list[str]:
    """``measure()``'s lines, once per ``kind``, variant, registry, model config, device and dtype in a process (the
    run gate's ``training = evaluation``, ``bf16 autocast = float32`` and ``GPU = CPU`` rows: each builds the variant
    again, the same answer for every seed of a run); a copy, since callers extend it."""
    key = (kind, tuple(sorted(variant.resolved().items())), id(registry), repr(model_cfg), str(device), dtype)
    held = _CACHE.get(key)
    if held is None or held[0] is not registry:  # an id is reused once its registry is freed
        held = _CACHE[key] = (registry, measure())
    return list(held[1])


def _gate_model(registry, variant: Variant, model_cfg, seed: int, device, state=None):
    """The variant built with dropout 0 on ``device`` (``state`` loaded when given), the run gate's batch there
    ``(src (B, S), tgt (B, T), labels (B, T))``, its real target positions ``keep`` (B, T) and the canonical name
    of each parameter by ``id`` (a tied one: its first name)."""
    from dataclasses import replace

    from ..model import canonical_state_dict, load_canonical_state_dict
    from .properties.rows import gate_batch

    cfg = replace(model_cfg, dropout=0.0)
    model = build_model(registry, variant, cfg, seed=seed).to(device)
    if state is not None:
        load_canonical_state_dict(model, state)
    src, tgt, labels = (t.to(device) for t in gate_batch(cfg, seed=seed))
    canonical = {id(t): name for name, t in reversed(canonical_state_dict(model).items())}
    return model, src, tgt, labels, tgt != cfg.pad, canonical


def _rebuilt(registry, variant: Variant, model_cfg, seed: int, model, device):
    """A fresh build of ``variant`` on ``device`` holding ``model``'s parameters (its buffers as a build makes them)."""
    fresh = build_model(registry, variant, model_cfg, seed=seed).to(device)
    fresh.load_state_dict({n: p.detach().to(device) for n, p in model.named_parameters()}, strict=False)
    return fresh


def _forward_backward(model, src, tgt, labels, keep, canonical: dict, bf16: bool = False):
    """``model``'s logits (B, T, V) in its current mode (under bf16 autocast with ``bf16``) and every parameter's
    gradient of the float32 cross-entropy at the real target positions ``keep``, by canonical name (reasons read
    the same in every layout; None where a parameter gets none)."""
    from torch.nn import functional as F

    model.zero_grad(set_to_none=True)
    with torch.enable_grad():
        with torch.autocast(src.device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(src, tgt)
        F.cross_entropy(logits[keep].float(), labels[keep]).backward()
    return logits.detach().float(), {canonical.get(id(p), n): (p.grad.detach().float().clone()
                                                                 if p.grad is not None else None)
                                     for n, p in model.named_parameters()}


def _max_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b|, a NaN counted as inf."""
    return float(torch.nan_to_num((a - b).abs(), nan=float("inf")).max())


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal within the run gate's threshold (:data:`~harness.checks.policy.GATE_ATOL`, ``GATE_RTOL``)."""
    from .policy import GATE_ATOL, GATE_RTOL

    return torch.allclose(a, b, rtol=GATE_RTOL, atol=GATE_ATOL, equal_nan=True)


#: Formulas (``Component(reference=...)``) whose training forward differs from their evaluation forward by
#: declaration: BatchNorm normalises with the batch's statistics in training, with running ones in evaluation.
TRAINING_DIFFERS = {"batch_norm"}


def _declares_training_difference(registry, variant: Variant) -> bool:
    """Whether a component of ``variant`` is held to a formula of :data:`TRAINING_DIFFERS`."""
    return any(registry.component(slot, name).reference in TRAINING_DIFFERS
               for slot, name in variant.resolved().items())


def modes_reasons(registry, variant: Variant, model_cfg, seed: int, device, state=None) -> list[str]:
    """With dropout 0, the training-mode logits of ``variant`` at the real target positions of the run gate's
    batch, and every parameter's gradient of the cross-entropy there, must equal the evaluation-mode ones
    (within the gate's threshold): the component contracts, ``check``'s pairs and the ``nn.MultiheadAttention`` /
    ``nn.Transformer`` comparisons all run in evaluation mode, so a component that computes the paper's
    function there and another one in training (another scale; the same forward with a gradient cut in
    training) would pass them all and be classed "same function" as the baseline. Likewise the
    evaluation-mode logits under ``torch.inference_mode`` (how held-out scores are computed) must equal
    those with autograd on.

    ``state``: a canonical state to load first (``check`` passes its random reference state, so no
    zero-initialised gain hides a sub-layer); default: the build from ``seed``. A variant using a component
    whose formula declares a training difference (:data:`TRAINING_DIFFERS`) is exempt. Returns one line when
    it fails (empty: it holds); a crash is such a line, never an exception."""
    if _declares_training_difference(registry, variant):
        return []
    model, src, tgt, labels, keep, canonical = _gate_model(registry, variant, model_cfg, seed, device, state)
    batch = (src, tgt, labels, keep, canonical)
    devices = [device.index or 0] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            evaluated, eval_grads = _forward_backward(model.eval(), *batch)
            trained, train_grads = _forward_backward(model.train(), *batch)
            with torch.inference_mode():  # as held-out evaluation scores the model
                inferred = model.eval()(src, tgt).float()
    except Exception as exc:  # noqa: BLE001 - the trial itself will fail with its own message
        from .inputs import describe_exception

        return [f"modes: the training/evaluation comparison crashes: {describe_exception(exc)}"]
    model.zero_grad(set_to_none=True)
    model.eval()
    return _modes_differ(evaluated[keep], eval_grads, trained[keep], train_grads, inferred[keep])


def _modes_differ(evaluated: torch.Tensor, eval_grads: dict, trained: torch.Tensor, train_grads: dict,
                  inferred: torch.Tensor) -> list[str]:
    """:func:`modes_reasons`' verdict from the logits at real target positions (n, V) and the gradients by
    parameter name of both modes, and the evaluation-mode logits under ``torch.inference_mode`` (``inferred``):
    padded positions are never scored, and PyTorch's inference fast paths may fill them differently."""
    from .policy import GATE_ATOL, GATE_RTOL

    for mode, logits in (("training", trained), ("evaluation", evaluated)):
        if not bool(torch.isfinite(logits).all()):
            return [f"modes: non-finite output in {mode} mode: the logits at real target positions are NaN or inf "
                    f"with dropout 0" + ("" if mode == "evaluation" else " (finite in evaluation mode): a component "
                                         "computes something else in training than every check (all in evaluation "
                                         "mode) saw")]
    if not _same(trained, evaluated):
        return [f"modes: with dropout 0 the training-mode logits differ from the evaluation-mode ones (max |Δ logit| "
                f"{_max_gap(trained, evaluated):.3g}): a component computes something else in training than every "
                f"check (all in evaluation mode) saw"]
    if not _same(inferred, evaluated):
        return [f"modes: the evaluation-mode logits under torch.inference_mode, as held-out scores are computed, differ "
                f"from those with autograd on (max |Δ logit| {_max_gap(inferred, evaluated):.3g}): a component "
                f"computes something else under inference mode than the checks saw"]
    differ, cut = [], []
    for name, g in eval_grads.items():
        t = train_grads[name]
        same = (g is None and t is None) or (g is not None and t is not None and torch.allclose(
            t, g, rtol=GATE_RTOL, atol=GATE_ATOL + GATE_RTOL * float(torch.nan_to_num(g.abs(), 0.0, 0.0, 0.0).max()),
            equal_nan=True))
        if not same:
            differ.append(name)
            if g is not None and g.any() and (t is None or not t.any()):
                cut.append(name)
    if not differ:
        return []
    example = (f"{cut[0]} gets none in training" if cut else f"e.g. {differ[0]}")
    return [f"modes: with dropout 0 the training-mode gradients of {len(differ)} parameter(s) differ from the "
            f"evaluation-mode ones while the logits agree ({example}): a component's backward is something else "
            f"in training than every check (all in evaluation mode) saw"]


def precision_reasons(registry, variant: Variant, model_cfg, seed: int, device, state=None) -> list[str]:
    """For a trial in bf16: the variant must compute under ``torch.autocast(bfloat16)`` the function it computes
    in float32 (every check, the run's recorded classes included, compares float32 models). Dropout 0,
    evaluation mode, the run gate's batch, logits at real target positions and the cross-entropy's gradients:
    the logits' autocast-vs-float32 gap must stay within :data:`~harness.checks.policy.PRECISION_LOGIT_FACTOR` times
    the gap that rounding the float32 weights to bf16 makes, the variant's own yardstick of how sensitive it is to
    bf16-sized changes; and a parameter with a gradient in float32 must have one under autocast. A component
    that changes its scale or cuts a gradient when autocast is on would otherwise be trained in bf16 as another
    function than the one classed "same function".
    ``state`` as in :func:`modes_reasons`. Returns one line when it fails (empty: it holds); a crash is such a
    line, never an exception."""
    device = torch.device(device)
    model, src, tgt, labels, keep, canonical = _gate_model(registry, variant, model_cfg, seed, device, state)
    model.eval()
    devices = [device.index or 0] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            full, full_g = _forward_backward(model, src, tgt, labels, keep, canonical)
            cast, cast_g = _forward_backward(model, src, tgt, labels, keep, canonical, bf16=True)
            with torch.no_grad():
                for p in model.parameters():
                    p.copy_(p.to(torch.bfloat16).float())
                rounded = model(src, tgt).float()
    except Exception as exc:  # noqa: BLE001 - the trial itself will fail with its own message
        from .inputs import describe_exception

        return [f"precision: the bf16/float32 comparison crashes: {describe_exception(exc)}"]
    return _precision_differ(full[keep], full_g, cast[keep], cast_g, rounded[keep])


def _precision_differ(full, full_g: dict, cast, cast_g: dict, rounded) -> list[str]:
    """:func:`precision_reasons`' verdict: float32 (``full``), autocast (``cast``) and bf16-rounded-weights
    (``rounded``) logits (n, V), and the float32 and autocast gradients by canonical parameter name."""
    from .policy import GATE_ATOL, GRADIENT_PRESENT, PRECISION_LOGIT_FACTOR

    logit_gap, logit_yard = _max_gap(cast, full), _max_gap(rounded, full)
    if logit_gap > PRECISION_LOGIT_FACTOR * logit_yard + GATE_ATOL:
        return [f"precision: under bf16 autocast the logits move {logit_gap:.3g} from the float32 ones, "
                f"{logit_gap / max(logit_yard, 1e-12):.0f}x what rounding the weights to bf16 moves them "
                f"({logit_yard:.3g}; limit {PRECISION_LOGIT_FACTOR:g}x): a component computes something else under "
                f"autocast than every check (all in float32) saw"]
    present = {n: g for n, g in full_g.items() if g is not None}
    top = max((float(g.abs().max()) for g in present.values()), default=0.0)
    cut = [n for n, g in present.items() if float(g.abs().max()) > GRADIENT_PRESENT * top
           and (cast_g.get(n) is None or not cast_g[n].any())]
    if cut:
        return [f"precision: under bf16 autocast {len(cut)} parameter(s) get no gradient that they get in float32 "
                f"(e.g. {cut[0]}): a component's backward is something else under autocast than the checks saw"]
    return []


def drift_reasons(registry, variant: Variant, model_cfg, seed: int, model, device, forward=None) -> list[str]:
    """After training: a fresh build of ``variant`` holding ``model``'s trained parameters (its buffers as a build
    makes them) must give ``model``'s evaluation-mode logits at the real target positions of the run gate's
    batch (within the gate's threshold). Every check and every gate item before this one saw components at
    their first calls; a component that changes with use -- one that counts its calls and switches its scale,
    keeps a key/value cache between batches, or updates a hidden buffer in its forward -- would train and be
    scored as another function. A variant using a component whose formula declares a training difference
    (:data:`TRAINING_DIFFERS`: BatchNorm's running statistics are such a buffer) is exempt. ``forward``:
    ``(src, tgt) -> logits`` of the module that actually trained, in evaluation mode, where that is not ``model``
    itself (a trial group trains one functional base module for all its seeds); default ``model``'s own
    forward. ``model``'s training mode and the global RNG state are left as they were. Returns one line when it
    fails (empty: it holds); a crash is such a line, never an exception."""
    from .properties.rows import gate_batch

    if _declares_training_difference(registry, variant):
        return []
    device = torch.device(device)
    src, tgt, _ = (t.to(device) for t in gate_batch(model_cfg, seed=seed))
    keep = tgt != model_cfg.pad
    was_training = model.training
    devices = [device.index or 0] if device.type == "cuda" else []
    try:
        fresh = _rebuilt(registry, variant, model_cfg, seed, model, device)
        with torch.random.fork_rng(devices=devices), torch.inference_mode():
            trained = (forward or model.eval())(src, tgt).float()[keep]
            built = fresh.eval()(src, tgt).float()[keep]
    except Exception as exc:  # noqa: BLE001 - the trial's own numbers stand; the line says why it is not trusted
        from .inputs import describe_exception

        return [f"drift: the comparison with a fresh build crashes: {describe_exception(exc)}"]
    finally:
        model.train(was_training)
    if _same(trained, built):
        return []
    return [f"drift: after training the model's logits differ from those of a fresh build holding its trained "
            f"parameters (max |Δ logit| {_max_gap(trained, built):.3g}): a component changes with use (a call "
            f"counter, a cache kept between batches, a buffer updated in its forward), so it was trained and scored "
            f"as another function than the one every check saw"]


def device_reasons(registry, variant: Variant, model_cfg, seed: int, device) -> list[str]:
    """For a trial on a GPU: the variant built from ``seed`` must give on ``device`` the evaluation-mode logits it
    gives on the CPU (float32, dropout 0, the run gate's batch, real target positions, within the gate's
    threshold). ``run`` records its equivalence classes from CPU comparisons and the component contracts run on
    the CPU, so a component that takes another code path on a GPU (a fused kernel with another scale, a branch
    on ``x.is_cuda``) would be classed with the baseline and trained as another function
    (``tests/plugins/evade_scale_on_gpu.py``; ``check`` on a machine with CUDA compares every variant there too).
    On the CPU it compares two CPU builds (the gate calls it for GPU trials only). Returns one line when it fails
    (empty: it holds); a crash is such a line, never an exception."""
    device = torch.device(device)
    try:
        here, src, tgt, _, keep, _ = _gate_model(registry, variant, model_cfg, seed, device)
        there = _rebuilt(registry, variant, model_cfg, seed, here, "cpu")
        devices = [device.index or 0] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.inference_mode():
            on_device = here.eval()(src, tgt).float()[keep].cpu()
            on_cpu = there.eval()(src.cpu(), tgt.cpu()).float()[keep.cpu()]
    except Exception as exc:  # noqa: BLE001 - the trial itself will fail with its own message
        from .inputs import describe_exception

        return [f"device: the {device.type}/CPU comparison crashes: {describe_exception(exc)}"]
    if _same(on_device, on_cpu):
        return []
    return [f"device: on {device.type} the evaluation-mode logits differ from the CPU's with the same weights (max "
            f"|Δ logit| {_max_gap(on_device, on_cpu):.3g}): a component takes another code path there than the CPU "
            f"checks saw"]
