"""Contracts of the ``positional`` and ``feed_forward`` slots: each component on its own, float64,
against the slot's reference -- or, for a component that declares ``differs=`` with
``reference="NAME"``, against that independent formula (:mod:`harness.checks.formulas`), with the
size of its declared difference from the slot's reference reported as well.

A positional component acts in up to two places: on the embeddings (``forward``) and inside
self-attention (``rotate_qk`` / ``score_bias``, reached through :class:`harness.model.PositionHooks`,
so a declared ``qk_order`` is applied exactly as in the model). Both are compared: the rotated
scores q_rot k_rot^T (what attention sees; they do not depend on the feature order) and the score bias.

Shape letters: B batch, H heads, L length, D = d_model, d_k = D / H.
"""
from __future__ import annotations

import math

import torch

from ..config import ModelConfig
from ..model import PositionHooks
from ..registry import Component
from .contract_base import (CONFORMS, VIOLATES, ComponentResult, component_result, crash_result, first_wrong_position,
                            formula_result, judge, load_random_state, output_gap, reference_components, rows_length,
                            sibling_context, sinusoidal_pe, unknown_formula)
from .contract_dropout import check_dropout
from .formulas import (FORMULAS, GATED, alibi_faults, alibi_reference, alibi_slope_fault, ffn_faults, ffn_reference,
                       rope_faults, rope_reference)
from .policy import LONGEST_ROW


def _first_match(got: torch.Tensor, faults: dict[str, torch.Tensor]) -> str:
    """The first fault whose output reproduces ``got`` ("" when none does)."""
    for text, alt in faults.items():
        g2, t2 = output_gap(got, alt)
        if g2 <= t2:
            return text
    return ""


# --------------------------------------------------------------------------- positional

def check_positional(comp: Component, cfg: ModelConfig, seed: int = 0) -> list[ComponentResult]:
    """``positional`` component: the embedding side (eval mode, float64, at lengths 5, 11 and max_len) against
    x * sqrt(D) + PE[:L] (the slot's reference) or its formula's; then, when it acts inside attention
    or its formula does, the rotated scores and the score bias against the formula's (a component held
    to the slot's reference must leave attention alone)."""
    bad = unknown_formula(comp)
    if bad:
        return bad
    formula = comp.reference
    label = "embeddings vs " + ("x * sqrt(d_model) + PE[:L]" if not formula else f"formula {formula!r}")
    try:
        mod = comp.factory(sibling_context(cfg, reference_components(positional=comp)))
        state = load_random_state(mod, seed)
        mod = mod.double().eval()
        emb = _embedding_side(mod, cfg, seed, formula, state)
        hooks = PositionHooks(mod, cfg.h)
        inside = _attention_side(hooks, cfg, seed, formula) if hooks.acts or formula in ("rotary", "linear_biases") else []
    except Exception as exc:  # noqa: BLE001
        return [crash_result(comp, label, exc)]
    (gap, thr, diagnosis), (dgap, dthr) = emb
    if not formula:
        out = [judge(comp, label, gap, thr, diagnosis)]
    else:
        out = [formula_result(comp, label, gap, thr, diagnosis),
               judge(comp, "declared difference vs x * sqrt(d_model) + PE[:L]", dgap, dthr)]
    for what, (g, t, diag) in inside:
        text = f"inside self-attention: {what}"
        out.append(formula_result(comp, text, g, t, diag) if formula else component_result(
            comp, text, VIOLATES if g > t else CONFORMS, g <= t, g, t,
            "acts inside attention but declares nothing: the slot's reference adds to the embeddings only "
            "(declare differs= and reference=)" if g > t else ""))
    return out


def _embedding_side(mod, cfg: ModelConfig, seed: int, formula: str, state):
    """((gap, threshold, diagnosis) vs the formula, (gap, threshold) vs the slot's reference), worst length.
    Lengths 5, 11 and ``cfg.max_len`` (at most :data:`~harness.checks.policy.LONGEST_ROW`; the longest sequence the
    model is built for: a table that is right only for short sequences is caught at the config the run trains with)."""
    g = torch.Generator().manual_seed(seed + 97)
    worst, worst_ref, diagnosis = (0.0, 1.0), (0.0, 1.0), ""
    for length in sorted({5, min(cfg.max_len, 11), min(cfg.max_len, LONGEST_ROW)}):
        x = torch.randn(2, length, cfg.d_model, generator=g).double()
        with torch.no_grad():
            got = mod(x)
        pe = sinusoidal_pe(length + 1, cfg.d_model)
        paper = x * math.sqrt(cfg.d_model) + pe[:length]
        want = {"": paper, "learned_absolute": x * math.sqrt(cfg.d_model) + state.get("weight", torch.zeros(1)).double()[:length],
                "rotary": x * math.sqrt(cfg.d_model), "linear_biases": x * math.sqrt(cfg.d_model),
                "unscaled_pe": x + pe[:length], "no_positions": x * math.sqrt(cfg.d_model)}[formula]
        gap = output_gap(got, want)
        ref_gap = output_gap(got, paper)
        worst = max(worst, gap, key=lambda gt: gt[0] / gt[1])
        worst_ref = max(worst_ref, ref_gap, key=lambda gt: gt[0] / gt[1])
        if gap[0] > gap[1] and not diagnosis:
            diagnosis = (_first_match(got, _embedding_faults(x, pe, length, cfg.d_model, want, formula))
                         or first_wrong_position(got, want, gap[1]))
    return (*worst, diagnosis), worst_ref


def _embedding_faults(x, pe, length: int, d: int, want, formula: str) -> dict:
    """The embedding side's known faults (name -> what such code outputs) for the formula ``formula``."""
    paper = x * math.sqrt(d) + pe[:length]
    if formula == "unscaled_pe":  # x + PE: the faults of a component meant to drop the scale
        return {"PE shifted by one position (PE[1:L+1])": x + pe[1:length + 1],
                "embeddings scaled by sqrt(d_model) although the formula has no scale": paper,
                "no positional encoding added": x}
    if formula == "no_positions":  # x * sqrt(D): the faults of a component meant to leave positions out
        return {"a sinusoidal PE added although the formula has none": paper,
                "no sqrt(d_model) scaling of the embeddings": x}
    return {"PE shifted by one position (PE[1:L+1])": x * math.sqrt(d) + pe[1:length + 1],
            "no sqrt(d_model) scaling of the embeddings": want - x * (math.sqrt(d) - 1),
            "embeddings scaled by d_model instead of sqrt(d_model)": want + x * (d - math.sqrt(d)),
            "no positional encoding added": x * math.sqrt(d),
            "a sinusoidal PE added although positions act inside attention": paper}


def _attention_side(hooks: PositionHooks, cfg: ModelConfig, seed: int, formula: str):
    """[(what, (gap, threshold, diagnosis))] for the rotated scores and the score bias, at the longest length the
    model is built for (``cfg.max_len``, at most :data:`~harness.checks.policy.LONGEST_ROW`)."""
    g = torch.Generator().manual_seed(seed + 107)
    h, d_k, length = cfg.h, cfg.d_model // cfg.h, min(cfg.max_len, LONGEST_ROW)
    q = torch.randn(2, h, length, d_k, generator=g, dtype=torch.float64)
    k = torch.randn(2, h, length, d_k, generator=g, dtype=torch.float64)
    with torch.no_grad():
        rq, rk = hooks.rotate(q, k)
        got = rq @ rk.transpose(-2, -1)  # (2, H, L, L)
        zeros = torch.zeros(2, h, length, length, dtype=torch.float64)
        bias = hooks.bias(zeros)
    plain = q @ k.transpose(-2, -1)
    want = rope_reference(q) @ rope_reference(k).transpose(-2, -1) if formula == "rotary" else plain
    gap = output_gap(got, want)
    out = [("scores q_rot k_rot^T" + (" vs RoFormer's rotation" if formula == "rotary" else " (unchanged)"),
            (*gap, _first_match(got, rope_faults(q, k, cfg.d_model)) if gap[0] > gap[1] and formula == "rotary" else ""))]
    bias = bias.expand(2, h, length, length)
    want_b = alibi_reference(h, length, length).expand(2, h, length, length) if formula == "linear_biases" else zeros
    bgap = output_gap(bias, want_b)
    faults = {t: b.expand(2, h, length, length) for t, b in alibi_faults(h, length, length).items()}
    named = ""
    if bgap[0] > bgap[1] and formula == "linear_biases":
        named = _first_match(bias, faults) or alibi_slope_fault(bias[0])
    out.append(("score bias" + (" vs -m_h |i - j|" if formula == "linear_biases" else " (none)"), (*bgap, named)))
    return out


# --------------------------------------------------------------------------- feed_forward

def _inner_width(comp: Component, label: str, state: dict, cfg: ModelConfig) -> list[ComponentResult]:
    """A ReLU / GELU FFN's canonical ``w_1`` must be (d_ff, D) and ``w_2`` (D, d_ff) (Vaswani et al. 2017 §3.3:
    the inner layer has dimensionality d_ff): a failing result naming the width it has, else []. The formula
    alone cannot see it, since an FFN of any inner width computes max(0, x W_1 + b_1) W_2 + b_2 with its own W."""
    w1, w2 = tuple(state["w_1.weight"].shape), tuple(state["w_2.weight"].shape)
    if w1 == (cfg.d_ff, cfg.d_model) and w2 == (cfg.d_model, cfg.d_ff):
        return []
    width = w1[0]
    return [component_result(comp, label, VIOLATES, False, diagnosis=(
        f"inner width {width} where the config's d_ff is {cfg.d_ff} (w_1 {w1}, w_2 {w2}; expected "
        f"({cfg.d_ff}, {cfg.d_model}) and ({cfg.d_model}, {cfg.d_ff}))"
        + (": d_ff = d_model, as note 002's MLP(dim, dim)" if width == cfg.d_model else "")))]


def check_feed_forward(comp: Component, cfg: ModelConfig, seed: int = 0) -> list[ComponentResult]:
    """``feed_forward`` component vs the ReLU FFN w_2(relu(w_1 x)) (the slot's reference) or its
    declared formula (GELU, SwiGLU, GEGLU), eval mode, float64, holding random canonical ``w_1``,
    ``w_2`` (gated: ``w_gate``, ``w_up``, ``w_down``) with ``nn.Linear`` projections, on rows of
    ``cfg.max_len`` positions (:func:`~harness.checks.contract_base.rows_length`): a layer that is
    position-wise only on short rows fails with the first position it gets wrong."""
    bad = unknown_formula(comp)
    if bad:
        return bad
    formula = comp.reference or "ffn_relu"
    label = f"vs {FORMULAS['feed_forward'][formula].split(' (')[0]}"
    try:
        mod = comp.factory(sibling_context(cfg, reference_components(feed_forward=comp)))
        state = load_random_state(mod, seed)
        need = ["w_gate.weight", "w_up.weight", "w_down.weight"] if formula in GATED else ["w_1.weight", "w_2.weight"]
        missing = [n for n in need if n not in state]
        if missing:
            return [component_result(comp, label, VIOLATES, False, diagnosis=(
                f"does not export the canonical layout (missing {', '.join(missing)}; has "
                f"{', '.join(sorted(state)) or 'nothing'}): w_1, w_2 (ReLU / GELU) or w_gate, w_up, w_down (gated)"))]
        if formula not in GATED:
            narrow = _inner_width(comp, label, state, cfg)
            if narrow:
                return narrow
        x = (torch.randn(3, rows_length(cfg, 5), cfg.d_model, generator=torch.Generator().manual_seed(seed + 109))
             * 2).double()  # (3, L, D): up to max_len, where a layer that is position-wise only on short rows shows
        with torch.no_grad():
            got = mod.double().eval()(x)
        want = ffn_reference(formula, x, state)
    except Exception as exc:  # noqa: BLE001
        return [crash_result(comp, label, exc)]
    gap, thr = output_gap(got, want)
    diagnosis = (_first_match(got, ffn_faults(formula, x, state)) or first_wrong_position(got, want, thr)) if gap > thr else ""
    if not comp.reference:
        return [judge(comp, label, gap, thr, diagnosis)] + check_dropout(comp, cfg, seed, "feed_forward")
    out = [formula_result(comp, label, gap, thr, diagnosis)]
    if formula not in GATED:  # a gated FFN has no w_1 / w_2: its difference shows in the pairs
        out.append(judge(comp, "declared difference vs the ReLU FFN", *output_gap(got, ffn_reference("ffn_relu", x, state))))
    return out + check_dropout(comp, cfg, seed, "feed_forward")  # dropout unbiased (harness.checks.contract_dropout)
