"""Contract of the ``mask`` slot: each mask component on its own against the reference masked softmax, with a
diagnosis naming the pattern of a wrong mask (shifted causal mask, padding ignored, mask inverted, a sliding
window of the wrong width) and the policy for a fully masked row.

Shape letters: B batch, S source length, T target length, H = h heads.
Sources: Vaswani et al. 2017 §3.2.3 (the decoder's causal mask); the study notes' mask bugs (a non in-place
``masked_fill``, uint8 masks); Mistral (Jiang et al. 2023) for the sliding window.
"""
from __future__ import annotations

import math

import torch

from ..config import ModelConfig
from ..registry import Component
from .contract_base import (CONFORMS, CRASHES, VIOLATES, ComponentResult, component_result, reference_components,
                            sibling_context, unknown_formula)
from .formulas import WINDOW_FAULTS, window_keep
from .inputs import describe_exception, fmt_size, padded_batch
from .policy import MASK_PROB_ATOL

# --------------------------------------------------------------------------- mask

def check_mask(comp: Component, cfg: ModelConfig, seed: int = 0) -> list[ComponentResult]:
    """A mask component's semantics, probed without a reference implementation.

    On two padded batches of different shapes (B, S, T): softmax(apply(scores, mask)) at real
    query rows must give zero weight exactly to the blocked keys (padded keys; for the target also
    later positions) and match the reference masked softmax; every row of the batch, padded query
    rows included, must be finite (a NaN there reaches the gradients); a source made only of
    padding must give what ``fully_masked_row`` declares. The diagnosis names the pattern
    (shifted causal mask, padding ignored, mask inverted).
    """
    bad = unknown_formula(comp)
    if bad:
        return bad
    style = sibling_context(cfg, reference_components(mask=comp)).make("mask")
    g = torch.Generator().manual_seed(seed + 41)
    problems = {"padding": [], "causal": [], "finite": []}
    worst = {"padding": 0.0, "causal": 0.0}
    window = cfg.sliding_window() if comp.reference == "causal_window" else 0
    for bs, s_len, t_len, bseed in ((4, 9, 10, seed), (3, 7, 12, seed + 1)):
        _mask_batch(style, cfg, g, padded_batch(cfg, bs, s_len, t_len, seed=bseed), problems, worst, window)
    out: list[ComponentResult] = []
    for kind in ("padding", "causal"):
        label = f"{kind} semantics (softmax at real query rows)"
        msgs = list(dict.fromkeys(problems[kind]))
        if msgs:
            out.append(component_result(comp, label, VIOLATES, False, worst[kind], MASK_PROB_ATOL, diagnosis=msgs[0],
                                        detail="; ".join(msgs[1:])))
        else:
            out.append(component_result(comp, label, CONFORMS, True, worst[kind], MASK_PROB_ATOL))
    msgs = list(dict.fromkeys(problems["finite"]))
    out.append(component_result(comp, "finite rows of a real batch", VIOLATES if msgs else CONFORMS, not msgs,
                                diagnosis=msgs[0] if msgs else "", detail="; ".join(msgs[1:])))
    out.append(_fully_masked_row(comp, style, cfg, g))
    return out


def _mask_batch(style, cfg: ModelConfig, g: torch.Generator, batch, problems: dict[str, list[str]],
                worst: dict[str, float], window: int = 0) -> None:
    """One padded batch of :func:`check_mask`: softmax(apply(scores, mask)) for the source padding and
    the target (padding & causal, within ``window`` keys when given: :func:`~harness.checks.formulas.window_keep`)
    masks against the reference masked softmax; adds to ``problems`` (kind -> messages) and raises ``worst``
    (kind -> largest error at real query rows)."""
    src, tgt, _ = batch
    b, s, t, h = src.size(0), src.size(1), tgt.size(1), cfg.h
    rows = (tgt != cfg.pad)[:, None, :].expand(b, h, t)  # (B, H, T) real query rows
    causal = window_keep(t, window) if window else torch.ones(t, t, dtype=torch.bool).tril()
    cases = {"padding": (torch.randn(b, h, t, s, generator=g), lambda: style.src_mask(src, cfg.pad),
                         (src != cfg.pad)[:, None, None, :].expand(b, h, t, s)),
             "causal": (torch.randn(b, h, t, t, generator=g), lambda: style.tgt_mask(tgt, cfg.pad),
                        ((tgt != cfg.pad)[:, None, None, :] & causal).expand(b, h, t, t))}
    for kind, (scores, make, keep) in cases.items():
        try:
            p = style.apply(scores.clone(), make()).float().softmax(-1)  # (B, H, T, K)
        except Exception as exc:  # noqa: BLE001
            problems[kind].append(f"crashes: {describe_exception(exc)}")
            worst[kind] = math.inf
            continue
        if p.shape != scores.shape:
            problems[kind].append(f"apply() returned scores of shape {tuple(p.shape)} for {tuple(scores.shape)}")
            worst[kind] = math.inf
            continue
        if not torch.isfinite(p).all():
            bad = (~torch.isfinite(p)).any(-1)  # (B, H, T)
            where = "real" if (bad & rows).any() else "padded"
            problems["finite"].append(f"the {kind} mask makes {int(bad[:, 0].sum())} row(s) NaN at {where} "
                                      f"query positions of a real batch (softmax of an all-blocked row); a NaN "
                                      f"there reaches the gradients and the loss")
        ref = scores.masked_fill(~keep, -math.inf).softmax(-1)
        d = torch.nan_to_num((p - ref).abs(), nan=math.inf)[rows]
        err = float(d.max()) if d.numel() else 0.0
        worst[kind] = max(worst[kind], err)
        if err > MASK_PROB_ATOL:
            problems[kind].append(_window_fault(p, tgt, cfg.pad, window, rows) if window and kind == "causal" else
                                  diagnose_mask(kind, p, keep, rows, cfg, src, tgt))


def _window_fault(p: torch.Tensor, tgt: torch.Tensor, pad: int, w: int, rows: torch.Tensor) -> str:
    """The :data:`~harness.checks.formulas.WINDOW_FAULTS` entry whose keep-mask gives the weights ``p``
    (B, H, T, T) non-zero exactly where they are, at real query ``rows`` (B, H, T); else a generic line."""
    seen = (p > 0) & rows[..., None]
    real = (tgt != pad)[:, None, None, :]
    for fault, text in WINDOW_FAULTS.items():
        if torch.equal(seen, (real & window_keep(tgt.size(1), w, fault)).expand_as(p) & rows[..., None]):
            return f"{text} (w = {w})"
    return f"the sliding-window mask's weights differ from the causal window i - {w} < j <= i at real query rows"


def _classify_row(p: torch.Tensor) -> str:
    if torch.isnan(p).all():
        return "nan"
    if not torch.isfinite(p).all():
        return "partly nan"
    if (p == 0).all():
        return "zeros"
    if torch.allclose(p, torch.full_like(p, 1.0 / p.size(-1)), atol=MASK_PROB_ATOL):
        return "uniform"
    return "finite"


def _fully_masked_row(comp: Component, style, cfg: ModelConfig, g: torch.Generator) -> ComponentResult:
    label = "fully masked row (a source of padding only)"
    row = torch.full((1, 6), cfg.pad)
    try:
        got = _classify_row(style.apply(torch.randn(1, 1, 1, 6, generator=g), style.src_mask(row, cfg.pad))
                            .float().softmax(-1))
    except Exception as exc:  # noqa: BLE001
        return component_result(comp, label, CRASHES, False, detail=f"crashes: {describe_exception(exc)}")
    want = comp.fully_masked_row
    ok = got == want or (want == "finite" and got in ("uniform", "zeros", "finite"))
    detail = f"gives {got}" + ("" if ok else
                               f", but the component declares fully_masked_row={want!r} (declare "
                               f"fully_masked_row={got!r} in its Component(...) if that is intended)")
    return component_result(comp, label, CONFORMS if ok else VIOLATES, ok, diagnosis="" if ok else detail, detail=detail)


def diagnose_mask(kind: str, p: torch.Tensor, keep: torch.Tensor, rows: torch.Tensor, cfg: ModelConfig,
                  src: torch.Tensor, tgt: torch.Tensor) -> str:
    """Name what a mask does wrong from the attention weights ``p`` (B, H, Tq, Tk) at real query
    ``rows`` (B, H, Tq) against the intended ``keep`` (B, H, Tq, Tk)."""
    seen = (p > MASK_PROB_ATOL) & rows[..., None]  # attended keys at real rows
    want = keep & rows[..., None]
    keys = (src if kind == "padding" else tgt) != cfg.pad  # (B, K) real keys
    real_keys = keys[:, None, None, :].expand_as(seen)
    if kind == "causal":
        tq, tk = p.size(-2), p.size(-1)
        i = torch.arange(tq)[:, None]
        j = torch.arange(tk)[None, :]
        later = rows.clone()
        later[..., 0] = False  # row 0 has no key left under a -1 shift: whatever it does, judge the rest
        for shift in (1, 2, -1, -2):
            pattern = (j <= i + shift) & real_keys
            judged = rows if shift > 0 else later
            if torch.equal(seen & judged[..., None], pattern & judged[..., None]):
                if shift > 0:
                    return (f"causal mask shifted by +{shift}: position i attends to position i+{shift} "
                            f"({shift} future token{'s' if shift > 1 else ''})")
                return (f"causal mask shifted by {shift}: position i cannot attend to itself"
                        + (" and position 0 attends to nothing" if shift == -1 else ""))
        if torch.equal(seen, real_keys & rows[..., None]):
            return "causal mask not applied: every position attends to every later real position"
    uniform = torch.full_like(p, 1.0 / p.size(-1))
    if torch.allclose(p[rows], uniform[rows], atol=MASK_PROB_ATOL):
        return f"the {kind} mask blocks every key: attention is uniform (mask inverted or all-blocked)"
    if torch.equal(seen, rows[..., None].expand_as(seen)) and not torch.equal(want, seen):
        return (f"the {kind} mask blocks nothing: padded{' and future' if kind == 'causal' else ''} keys get "
                f"attention weight up to {fmt_size(float(p[~keep & rows[..., None]].max()))} (mask not applied)")
    leak = seen & ~want
    if kind == "padding" and leak.any() and torch.equal(seen & real_keys, want & real_keys):
        return (f"source padding ignored: real query rows attend to padded keys (weight up to "
                f"{fmt_size(float(p[leak].max()))})")
    if kind == "causal" and leak.any():
        b_, h_, i_, j_ = (int(x) for x in leak.nonzero()[0])
        what = "a later position" if j_ > i_ else "a padded key"
        return f"target mask leaks: position {i_} attends to position {j_} ({what}) in row {b_}"
    missing = want & ~seen
    if missing.any():
        b_, h_, i_, j_ = (int(x) for x in missing.nonzero()[0])
        return f"the {kind} mask blocks a key it must keep: position {i_} cannot attend to real key {j_} (row {b_})"
    return f"the {kind} mask's weights differ from the reference masked softmax at real query rows"


