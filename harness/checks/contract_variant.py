"""The model-level contract of one variant: what every assembled model must honour besides its
components' slot contracts and the mask probes.

Shape letters: B batch, T target length, V vocabulary.

Checked by :func:`variant_contract`, in float32 on the session's device, eval mode, the model holding
the session's reference canonical state (every canonical parameter random, so a gain that starts at
0 -- ReZero's alpha, Bachlechner et al. 2021 -- does not hide the sub-layers behind it):

* **logits**: shape (B, T, V) and finite everywhere on the padded check batch;
* **gradients**: every parameter (``named_parameters``) gets a finite, non-zero gradient of the
  cross-entropy at real target positions; a parameter with no gradient is unused (it inflates the
  ``params`` column and never trains);
* **canonical round trip**: the canonical state loads into a fresh model (another seed) without
  lossy-load notes, survives exactly and gives bitwise the same logits;
* **same seed, same model**: two builds from the check seed give bitwise the same logits;
* **positions reach attention**: when the positional component acts inside attention (RoPE, ALiBi),
  the attention modules ask ``ctx.positions`` for it in a forward (an attention component that never
  does would silently train a model with no positions at all);
* **training = evaluation at dropout 0**: built with dropout 0, the model's training-mode logits and
  gradients equal its evaluation-mode ones, and its evaluation-mode logits under ``torch.inference_mode``
  equal those with autograd on (:func:`harness.checks.gate.modes_reasons`): every other check runs in evaluation
  mode, so a component that is the paper's function only there would otherwise be classed with the
  baseline (``tests/plugins/adv_scale_in_training.py``); BatchNorm's declared difference is exempt;
* **bf16 autocast = float32**: under ``torch.autocast(bfloat16)`` the logits stay within a few times what
  rounding the weights to bf16 changes them, and no parameter loses its gradient
  (:func:`harness.checks.gate.precision_reasons`): every other check runs in float32, so a component
  that is the paper's function only there would be trained in bf16 as another one
  (``tests/plugins/adv_scale_in_bf16.py``).

``harness check`` (:func:`harness.checks.whole.run_checks`) runs it on every variant next to the
probes, and the conformance kit (:mod:`harness.testing`) runs ``run_checks`` itself, so the two
cannot disagree.
"""
from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from ..model import build_model, canonical_state_dict, load_canonical_state_dict
from ..registry import Variant
from .gate import modes_reasons, precision_reasons
from .inputs import describe_exception
from .properties.measure import ProbeResult
from .runs import CheckSession, load_variant


def _result(name: str, item: str, detail: str) -> ProbeResult:
    return ProbeResult(name, item, "eval", not detail, math.inf if detail else 0.0, 0.0, detail)


def _names(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" (+{len(names) - 3} more)" if len(names) > 3 else "")


def _gradient_detail(model) -> str:
    """One clause per kind of bad gradient (none, non-finite, all-zero), naming the parameters."""
    kinds: dict[str, list[str]] = {"no gradient (unused: it inflates params and never trains)": [],
                                   "a non-finite gradient": [], "an all-zero gradient": []}
    for pname, p in model.named_parameters():
        key = ("no gradient (unused: it inflates params and never trains)" if p.grad is None else
               "a non-finite gradient" if not torch.isfinite(p.grad).all() else
               "an all-zero gradient" if not p.grad.any() else "")
        if key:
            kinds[key].append(pname)
    return "; ".join(f"parameter(s) {_names(names)} get {kind}" for kind, names in kinds.items() if names)


def _positions_detail(model, s: CheckSession) -> str:
    """"" unless the positional component acts inside attention and no forward asked ``ctx.positions``."""
    hooks = getattr(model, "position_hooks", ())
    if any(hk.acts and hk.calls == 0 for hk in hooks):
        r = model.slots
        return (f"positional={r.get('positional')} acts inside attention but attention={r.get('attention')} never calls "
                f"ctx.positions.rotate(q, k) / ctx.positions.bias(scores): the model has no positions")
    return ""


def _round_trip(s: CheckSession, v: Variant, model, src, tgt, logits) -> str:
    """The model's canonical state into a fresh model built from another seed: notes, values, logits."""
    state = {k: t.detach().clone() for k, t in canonical_state_dict(model).items()}
    fresh = build_model(s.registry, v, s.cfg, s.seed + 1).to(s.device).eval()
    try:
        out = [f"lossy: {n}" for n in load_canonical_state_dict(fresh, state)]
    except Exception as exc:  # noqa: BLE001
        return f"canonical round trip: load_canonical_state_dict fails: {describe_exception(exc)}"
    out += [f"canonical parameter {k} does not survive it" for k, t in canonical_state_dict(fresh).items()
            if k not in state or not torch.equal(t, state[k])]
    with torch.no_grad():
        if not out and not torch.equal(fresh(src, tgt), logits):
            out.append("a fresh model holding the canonical state computes different logits")
    return "canonical round trip: " + "; ".join(out[:3]) if out else ""


def _same_seed(s: CheckSession, v: Variant, src, tgt) -> str:
    with torch.no_grad():
        a, b = (build_model(s.registry, v, s.cfg, s.seed).to(s.device).eval()(src, tgt) for _ in range(2))
    return "" if torch.equal(a, b) else \
        f"two builds with seed {s.seed} give different logits (init is not a function of the seed)"


def variant_contract(s: CheckSession, v: Variant) -> list[ProbeResult]:
    """The items of the module docstring for ``v``: one :class:`ProbeResult` per item (``probe`` names
    it, ``detail`` says what broke; a crash is one failed result)."""
    src, tgt, labels = (t.to(s.device) for t in s.batch)
    keep = tgt != s.cfg.pad
    try:
        model, _ = load_variant(s.registry, v, s.cfg, s.state_for(v.name))
        model = model.to(s.device).eval()
        model.zero_grad(set_to_none=True)
        logits = model(src, tgt)
        want = (src.size(0), tgt.size(1), s.cfg.vocab)
        if tuple(logits.shape) != want:
            return [_result(v.name, "logits", f"logits have shape {tuple(logits.shape)}, expected (B, T, V) = {want}")]
        finite = "" if torch.isfinite(logits).all() else "logits contain NaN or inf on a padded batch"
        F.cross_entropy(logits[keep].float(), labels[keep]).backward()
        out = [_result(v.name, "logits", finite), _result(v.name, "gradients", _gradient_detail(model)),
               _result(v.name, "positions reach attention", _positions_detail(model, s))]
        model.zero_grad(set_to_none=True)
        logits = logits.detach()
        out.append(_result(v.name, "canonical round trip", _round_trip(s, v, model, src, tgt, logits)))
        out.append(_result(v.name, "same seed, same model", _same_seed(s, v, src, tgt)))
        out.append(_result(v.name, "training = evaluation (dropout 0)",
                           "; ".join(r.split(": ", 1)[1] for r in modes_reasons(s.registry, v, s.cfg, s.seed,
                                                                                 torch.device(s.device),
                                                                                 s.state_for(v.name)))))
        out.append(_result(v.name, "bf16 autocast = float32",
                           "; ".join(r.split(": ", 1)[1] for r in precision_reasons(s.registry, v, s.cfg, s.seed,
                                                                                     torch.device(s.device),
                                                                                     s.state_for(v.name)))))
    except Exception as exc:  # noqa: BLE001 - a crash is a result
        return [_result(v.name, "model contract", f"crashes: {describe_exception(exc)}")]
    return out
