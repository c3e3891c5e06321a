"""Contract of the ``attention`` slot: each component on its own against the float64 reference attention, with a
diagnosis naming the known fault that reproduces a wrong output (:data:`ATTENTION_FAULTS`, :data:`QK_NORM_FAULTS`,
:data:`POSITION_FAULTS`). The ``mask`` slot's contract: :mod:`harness.checks.contract_mask`.

Shape letters: B batch, S source length, T target length, D = d_model, H = h heads, d_k = D / H.
Sources: Vaswani et al. 2017 §3.2; PyTorch ``nn.MultiheadAttention``; the study notes' bugs.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from ..config import ModelConfig
from ..model import canonical_state_dict
from ..registry import Component
from ..model import PositionHooks
from .contract_base import (TAKES_NO_POSITIONS, VIOLATES, ComponentResult, ReferenceMask, component_result, crash_result,
                            formula_result, judge, load_random_state, output_gap, reference_components,
                            rows_length, sibling_context, unknown_formula)
from .contract_dropout import check_dropout
from .formulas import alibi_reference, rope_reference
from .inputs import padded_batch

# --------------------------------------------------------------------------- attention

def reference_attention(query: torch.Tensor, kv: torch.Tensor, state: dict[str, torch.Tensor], h: int,
                        keep: torch.Tensor, fault: str = "", positions: str = "", formula: str = "") -> torch.Tensor:
    """Multi-head attention in float64 from canonical weights, optionally with one known ``fault``.

    Args:
        query: (B, Tq, D); kv: (B, Tk, D) (keys and values).
        state: ``w_q, w_o`` ``.weight`` (D, D), ``w_k, w_v`` ``.weight`` (n_kv d_k, D) and optional
            ``.bias``; n_kv (read from the ``w_k`` rows) K/V heads, each serving a contiguous group of
            h / n_kv query heads (query head i reads K/V head i // (h / n_kv): LLaMA's ``repeat_kv``,
            Ainslie et al. 2023); n_kv = h is multi-head attention.
        keep: (B, 1, Tq, Tk) bool, True = attend. fault: "" or a key of :data:`ATTENTION_FAULTS`, :data:`POSITION_FAULTS`
            or :data:`QK_NORM_FAULTS`. formula: "" or ``"qk_rmsnorm"`` (:func:`qk_normed`, the gains from ``state``).
        positions: "" (none), ``"rotary"`` (q and k of each head rotated, :func:`~harness.checks.formulas.rope_reference`)
            or ``"linear_biases"`` (:func:`~harness.checks.formulas.alibi_reference` added to the scaled scores).

    Returns: (B, Tq, D) float64.
    """
    b, tq, d = query.shape
    tk, d_k, n_kv = kv.size(1), d // h, kv_heads_of(state, h, d // h)

    def lin(x, n):
        bias = state.get(f"{n}.bias")
        return F.linear(x.double(), state[f"{n}.weight"].double(), None if bias is None else bias.double())

    q, k, v = lin(query, "w_q"), lin(kv, "w_k"), lin(kv, "w_v")
    if fault == "kv_swapped":
        k, v = v, k
    if fault == "k_is_v":
        v = k

    def split(x, length, heads=h):  # (B, L, heads*d_k) -> (B, heads, L, d_k)
        if fault == "no_transpose":
            return x.reshape(b, heads, length, d_k)
        return x.reshape(b, length, heads, d_k).transpose(1, 2)

    if fault == "rope_before_split" and positions == "rotary":
        q, k = rope_reference(q), rope_reference(k)  # (B, L, D): frequencies over d_model
    q, k, v = split(q, tq), split(k, tk, n_kv), split(v, tk, n_kv)
    q, k = qk_normed(q, k, state, formula, fault)
    k, v = _grouped_kv(k, h, fault), _grouped_kv(v, h, fault)
    q, k, v, kt = _rotated(q, k, v, fault) if positions == "rotary" else (q, k, v, None)
    scale = {"scale_d_model": 1.0 / d, "scale_sqrt_d_model": 1.0 / math.sqrt(d), "no_scale": 1.0,
             "scale_d_k": 1.0 / d_k}.get(fault, 1.0 / math.sqrt(d_k))
    scores = torch.matmul(q, k.transpose(-2, -1) if kt is None else kt) * scale  # (B, H, Tq, Tk)
    if positions == "linear_biases" and fault != "positions_ignored":
        scores = scores + alibi_reference(h, tq, tk)
    blocked = ~keep.expand(b, 1, tq, tk)
    if fault == "mask_rows_permuted":  # folded heads: mask.repeat(H) where repeat_interleave was meant
        folded = keep.expand(b, 1, tq, tk)[:, 0].repeat(h, 1, 1)  # (H*B, Tq, Tk), index = head*B + b
        blocked = ~folded.reshape(b, h, tq, tk)  # read back batch-major (index = b*H + head)
    if fault not in ("mask_ignored", "mask_after_softmax"):
        scores = scores.masked_fill(blocked, float("-inf"))  # (B, 1 or H, Tq, Tk) broadcast
    dim = -2 if fault == "softmax_queries" else -1
    p = scores.softmax(dim=dim)
    if fault == "mask_after_softmax":
        p = p.masked_fill(blocked, 0.0)
    p = torch.nan_to_num(p, nan=0.0)
    x = torch.matmul(p, v)  # (B, H, Tq, d_k)
    x = x.reshape(b, tq, d) if fault == "no_transpose" else x.transpose(1, 2).reshape(b, tq, d)  # (B, Tq, D)
    return x if fault == "no_out_proj" else lin(x, "w_o")


def _rms(x: torch.Tensor, g: torch.Tensor, dims=(-1,)) -> torch.Tensor:
    return x / (x.pow(2).mean(dims, keepdim=True) + 1e-6).sqrt() * g.double()


def qk_normed(q: torch.Tensor, k: torch.Tensor, state: dict[str, torch.Tensor], formula: str, fault: str = ""):
    """QK-norm (``formula="qk_rmsnorm"``): each head's q and k (B, heads, L, d_k) RMS-normalised over d_k,
    eps 1e-6, times the gains ``q_norm.weight``, ``k_norm.weight`` (d_k,), before RoPE (Gemma 3, Qwen3;
    Dehghani et al. 2023 with LayerNorm); or as a :data:`QK_NORM_FAULTS` entry does it. Unchanged without ``formula``."""
    if formula != "qk_rmsnorm":
        return q, k
    gq, gk = state["q_norm.weight"], state["k_norm.weight"]
    if fault == "qk_norm_d_model":  # statistics over every head's features (B, L, D) instead of each head's d_k
        return _rms(q, gq, (1, 3)), _rms(k, gk, (1, 3))
    if fault == "qk_norm_q_only":
        return _rms(q, gq), k.double()
    if fault == "qk_norm_gains_swapped":
        return _rms(q, gk), _rms(k, gq)
    if fault == "qk_norm_no_gain":
        return _rms(q, torch.ones_like(gq)), _rms(k, torch.ones_like(gk))
    return _rms(q, gq), _rms(k, gk)


#: Known QK-norm mistakes (tried for a component declaring ``reference="qk_rmsnorm"``).
QK_NORM_FAULTS: dict[str, str] = {
    "qk_norm_d_model": "QK-norm statistics over d_model (all heads together) where each head is normalised over "
                       "its own d_k (OLMo 2 normalises so on purpose: a component that does declares its own "
                       "formula, not reference='qk_rmsnorm')",
    "qk_norm_q_only": "QK-norm applied to q only (k not normalised)",
    "qk_norm_gains_swapped": "QK-norm gains swapped (q_norm.weight used on k and k_norm.weight on q)",
    "qk_norm_no_gain": "QK-norm gains q_norm.weight, k_norm.weight never applied (q and k only RMS-normalised): "
                       "the gains get no gradient and never train",
}

#: Canonical parameters a declared formula reads (``reference=``), named when a component lacks them.
FORMULA_PARAMETERS: dict[str, tuple[str, ...]] = {"qk_rmsnorm": ("q_norm.weight", "k_norm.weight")}


def kv_heads_of(state: dict[str, torch.Tensor], h: int, d_k: int) -> int:
    """n_kv, the K/V heads of canonical attention ``state``: the ``w_k`` rows / d_k (h for multi-head attention).

    Raises:
        ValueError: ``w_k`` rows not a multiple of d_k, n_kv not dividing h, or ``w_v`` of another shape.
    """
    rows = state["w_k.weight"].size(0)
    n_kv = rows // d_k
    if n_kv < 1 or n_kv * d_k != rows or h % n_kv or state["w_v.weight"].shape != state["w_k.weight"].shape:
        raise ValueError(f"w_k {tuple(state['w_k.weight'].shape)} / w_v {tuple(state['w_v.weight'].shape)}: the rows "
                         f"must be n_kv * d_k = n_kv * {d_k} with n_kv dividing h = {h}")
    return n_kv


def _grouped_kv(x: torch.Tensor, h: int, fault: str) -> torch.Tensor:
    """(B, n_kv, Tk, d_k) -> (B, H, Tk, d_k): K/V head j serves query heads j*g .. (j+1)*g - 1, g = H / n_kv
    (``repeat_interleave``); the ``kv_heads_tiled`` fault tiles them (``repeat``: query head i reads i % n_kv)."""
    n_kv = x.size(1)
    if n_kv == h:
        return x
    return x.repeat(1, h // n_kv, 1, 1) if fault == "kv_heads_tiled" else x.repeat_interleave(h // n_kv, dim=1)


def _rotated(q, k, v, fault: str):
    """RoPE on the split heads (B, H, L, d_k) as the reference applies it, or as ``fault`` does:
    (q, k, v, k^T rotated after the transpose or None)."""
    if fault in ("positions_ignored", "rope_before_split"):
        return q, k, v, None
    kt = None
    if fault == "rope_k_transposed":  # rotated after the transpose: positions along d_k, pairs along Tk
        kt = rope_reference(k.transpose(-2, -1))
    else:
        k = rope_reference(k)
    return rope_reference(q), k, rope_reference(v) if fault == "rope_on_v" else v, kt


#: Known ways hand-written attention goes wrong: fault -> what the check prints when it matches.
ATTENTION_FAULTS: dict[str, str] = {
    "scale_d_model": "scores divided by d_model instead of sqrt(d_k)",
    "scale_sqrt_d_model": "scores divided by sqrt(d_model) instead of sqrt(d_k)",
    "scale_d_k": "scores divided by d_k instead of sqrt(d_k)",
    "no_scale": "scores not scaled (the 1/sqrt(d_k) factor is missing)",
    "softmax_queries": "softmax taken over the query axis (dim=-2) instead of the keys",
    "no_transpose": "heads split with view(B, h, L, d_k) without transpose: positions and heads mixed",
    "kv_swapped": "keys and values swapped (w_k used for the values, w_v for the keys)",
    "k_is_v": "the key projection used for the values",
    "mask_ignored": "the mask never reaches the scores (no position or key is blocked)",
    "mask_after_softmax": "the mask applied after the softmax (blocked weights zeroed, rows not renormalised)",
    "mask_rows_permuted": "the mask folded into the heads with repeat() where the heads are batch-major "
                          "(repeat_interleave): each row gets another row's mask",
    "no_out_proj": "the output projection w_o is not applied",
    "kv_heads_tiled": "K/V heads tiled with repeat() where each K/V head serves a contiguous group of query heads "
                      "(LLaMA's repeat_kv = repeat_interleave over the head axis): query head i reads K/V head "
                      "i % n_kv instead of i // (h / n_kv)",
}

#: Known ways attention code mishandles positions that act inside it (tried when the check gives the
#: attention reference RoPE or ALiBi positions through ``ctx.positions``).
POSITION_FAULTS: dict[str, str] = {
    "positions_ignored": "ctx.positions never reaches the scores: RoPE or ALiBi would be silently dropped (call "
                         "ctx.positions.rotate(q, k) on the split heads and ctx.positions.bias(scores) on the scaled "
                         "scores)",
    "rope_on_v": "RoPE applied to the values too (only q and k are rotated; RoFormer §3.4.2)",
    "rope_k_transposed": "RoPE applied to k after the transpose for Q K^T: positions taken along d_k and feature "
                         "pairs along the keys",
    "rope_before_split": "RoPE applied before the heads are split (pairs and frequencies over d_model instead of "
                         "each head's d_k)",
}

#: Canonical names every attention component must export.
ATTENTION_LAYOUT = ("w_q.weight", "w_k.weight", "w_v.weight", "w_o.weight")


def _attention_inputs(cfg: ModelConfig, seed: int, src_len: int = 9, tgt_len: int = 10):
    src, tgt, _ = padded_batch(cfg, src_len=src_len, tgt_len=tgt_len, seed=seed)
    g = torch.Generator().manual_seed(seed + 71)
    b, s, t, d = src.size(0), src.size(1), tgt.size(1), cfg.d_model
    x, mem = torch.randn(b, t, d, generator=g), torch.randn(b, s, d, generator=g)
    return src, tgt, x, mem


def _attention_case(attn: nn.Module, x, kv, mask, dtype: torch.dtype) -> torch.Tensor:
    """The component's output (B, T, D) in ``dtype`` (eval mode, no autograd), as float64."""
    with torch.no_grad():
        return attn.to(dtype)(x.to(dtype), kv.to(dtype), kv.to(dtype), mask).double()


class _ReferenceRoPE:
    """The attention check's RoPE sibling: RoFormer's rotation (:func:`~harness.checks.formulas.rope_reference`)."""

    def rotate_qk(self, q, k):
        return rope_reference(q).to(q.dtype), rope_reference(k).to(k.dtype)


class _ReferenceALiBi:
    """The attention check's ALiBi sibling: -m_h |i - j| (:func:`~harness.checks.formulas.alibi_reference`)."""

    def __init__(self, h: int):
        self.h = h

    def score_bias(self, tq, tk, device, dtype):
        return alibi_reference(self.h, tq, tk).to(device, dtype)


#: (kind, positions) of every attention case: the positions act in self-attention only.
ATTENTION_CASES = (("self", ""), ("cross", ""), ("self", "rotary"), ("self", "linear_biases"))


def check_attention(comp: Component, cfg: ModelConfig, seed: int = 0) -> list[ComponentResult]:
    """Attention component on its own (reference mask and ``nn.Linear`` siblings), self-attention
    (causal + padding keep-mask, T x T) and cross-attention (source padding, T x S), and self-attention
    again with the reference RoPE and ALiBi positions behind ``ctx.positions``, run in float64
    and in float32 (a component right in one precision only is wrong; the RoPE case is left out when
    d_k = d_model / h is odd, where no RoPE component can be built), against the float64
    :func:`reference_attention`. Compared at real query rows (padded query rows are never scored).
    Eval mode must be deterministic (no dropout left on). On a difference the known faults
    (:data:`POSITION_FAULTS` with positions, then :data:`ATTENTION_FAULTS`) are tried for a diagnosis."""
    bad = unknown_formula(comp)
    if bad:
        return bad
    inputs = _attention_inputs(cfg, seed)
    longest = rows_length(cfg, 10)  # long case: max_len up to policy.LONGEST_ROW, beside the batch's 9 and 10 tokens
    positions = {"": None, "rotary": PositionHooks(_ReferenceRoPE(), cfg.h), "linear_biases": PositionHooks(_ReferenceALiBi(cfg.h), cfg.h)}
    out = []
    odd_d_k = (cfg.d_model // cfg.h) % 2 == 1  # RoPE rotates feature pairs: undefined for an odd d_k
    # the long cases: a component right only for short sequences (block-local above some length) is caught at
    # the length the config allows (tests/plugins/adv_attention_chunks_16.py)
    long_cases = [(kind, "", longest) for kind in ("self", "cross")] if longest > 10 else []
    for kind, pos, length in [(k, p, 0) for k, p in ATTENTION_CASES] + long_cases:
        if pos == "rotary" and odd_d_k:
            continue
        shown = {"rotary": "RoPE", "linear_biases": "ALiBi"}.get(pos, pos)
        label = (f"{kind}-attention vs scaled dot-product attention" + (f" with {shown} positions" if pos else "")
                 + (f" at length {length}" if length else ""))
        ctx = sibling_context(cfg, reference_components(attention=comp))
        ctx.self_positions = positions[pos]
        if positions[pos] is not None:
            positions[pos].calls = 0
        try:
            case_inputs = _attention_inputs(cfg, seed, length - 1, length) if length else inputs
            out.append(_attention_case_result(comp, ctx, cfg, seed, kind, pos, label, case_inputs))
        except Exception as exc:  # noqa: BLE001 - a crash is a result
            out.append(crash_result(comp, label, exc))
    return out + check_dropout(comp, cfg, seed, "attention")  # dropout unbiased (harness.checks.contract_dropout)


def _attention_case_result(comp, ctx, cfg: ModelConfig, seed: int, kind: str, pos: str, label: str, inputs):
    """One case of :func:`check_attention` (raises on a crash)."""
    src, tgt, x, mem = inputs
    real = (tgt != cfg.pad)  # (B, T) real query rows
    attn = ctx.attention(cross=kind == "cross")
    names = canonical_state_dict(attn)
    missing = [n for n in ATTENTION_LAYOUT if n not in names]
    if missing:
        return component_result(comp, label, VIOLATES, False, detail=(
            f"does not export the canonical layout (missing {', '.join(missing)}; has "
            f"{', '.join(sorted(names)) or 'nothing'}): define canonical_state()/load_canonical_state()"))
    lacking = [n for n in FORMULA_PARAMETERS.get(comp.reference, ()) if n not in names]
    if lacking:
        return component_result(comp, label, VIOLATES, False, diagnosis=(
            f"the component has no parameter {', '.join(lacking)}, which the formula it declares "
            f"(reference={comp.reference!r}) applies: a gain of shape (d_k,) on each head's normalised q and k; "
            f"export it from canonical_state(), or declare another formula"))
    state = load_random_state(attn, seed)
    attn = attn.eval()
    kv = x if kind == "self" else mem
    mask = ReferenceMask().tgt_mask(tgt, cfg.pad) if kind == "self" else ReferenceMask().src_mask(src, cfg.pad)
    keep = mask.expand(x.size(0), 1, x.size(1), kv.size(1))
    ref = reference_attention(x, kv, state, cfg.h, keep, positions=pos, formula=comp.reference)
    runs = {prec: _attention_case(attn, x, kv, mask, dt) for prec, dt in
            (("float64", torch.float64), ("float32", torch.float32))}
    again = _attention_case(attn, x, kv, mask, torch.float64)
    if pos and ctx.self_positions.calls == 0:
        return component_result(comp, label, TAKES_NO_POSITIONS, True, detail=(
            "never calls ctx.positions: works with positions added to the embeddings only; a variant that pairs it "
            "with a positional component acting inside attention (RoPE, ALiBi) fails the model contract"))
    if not torch.equal(torch.nan_to_num(again), torch.nan_to_num(runs["float64"])):
        return component_result(comp, label, VIOLATES, False, output_gap(again, runs["float64"])[0], 0.0, diagnosis=(
            "eval mode is not deterministic: two identical calls differ (dropout left on in eval mode, "
            "e.g. F.dropout without training=self.training)"))
    gaps = {prec: output_gap(got[real], ref[real]) for prec, got in runs.items()}
    prec = max(gaps, key=lambda k: gaps[k][0] / gaps[k][1])
    gap, thr = gaps[prec]
    diagnosis = ""
    if gap > thr:
        diagnosis = _diagnose_attention(runs[prec][real], x, kv, state, cfg.h, keep, real, pos, comp.reference)
        if gaps["float64"][0] <= gaps["float64"][1]:
            diagnosis = f"right in float64 but not in float32 ({diagnosis or 'unknown fault'})"
        elif not diagnosis:
            diagnosis = _first_query(runs[prec], ref, real, thr)
    return formula_result(comp, label, gap, thr, diagnosis) if comp.reference else judge(comp, label, gap, thr, diagnosis)


def _first_query(got: torch.Tensor, ref: torch.Tensor, real: torch.Tensor, thr: float) -> str:
    """"right for query positions 0 to p - 1, wrong from p on" for outputs (B, T, D) that agree on a prefix of the
    real query rows ``real`` (B, T) ("" when they differ from position 0)."""
    bad = (((got - ref).abs().nan_to_num(nan=math.inf) > thr).any(dim=-1) & real).any(dim=0)  # (T,)
    first = int(bad.nonzero()[0]) if bad.any() else 0
    return f"right for query positions 0 to {first - 1}, wrong from position {first} on" if first > 0 else ""


def _diagnose_attention(got: torch.Tensor, x, kv, state, h: int, keep, real, positions: str = "", formula: str = "") -> str:
    """The first :data:`POSITION_FAULTS` (with ``positions``) or :data:`ATTENTION_FAULTS` entry that
    reproduces ``got`` (rows at ``real``), compared where ``got`` is finite; "" when none does."""
    finite = torch.isfinite(got)
    note = "" if finite.all() else " (and NaN or inf in the output)"
    if not finite.any():
        return "the output is NaN or inf at every real query row"
    faults = {**(QK_NORM_FAULTS if formula else {}), **(POSITION_FAULTS if positions else {}), **ATTENTION_FAULTS}
    for fault, text in faults.items():
        try:
            alt = reference_attention(x, kv, state, h, keep, fault, positions, formula)[real]
        except RuntimeError:  # a fault that cannot apply to these shapes
            continue
        g2, t2 = output_gap(got[finite], alt[finite])
        if g2 <= t2:
            return text + note
    return "NaN or inf in the output at real query rows" if note else ""
