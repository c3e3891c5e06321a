"""Slot contracts: what a component of each slot must compute, and the checks that hold every
component -- built-in or plugin -- to it.

Shape letters: B batch, L length, S source length, T target length, D = d_model, H = h heads,
d_k = D / H, V vocabulary.

Every slot has a *reference* (:data:`SLOT_REFERENCES`). A component is held to it unless its own
registration says otherwise (:class:`harness.registry.Component`):

* ``differs="..."`` -- a deliberate difference (RMSNorm, another scaling, an approximation): the
  check measures and reports its size instead of failing;
* ``equivalent_to="other"`` -- held to another component of the slot instead;
* ``buggy=True`` -- a faithful reproduction of a bug: the checks must flag it.

Each component is checked *on its own*: its siblings are the harness's own reference
implementations (a -inf keep-mask, ``nn.LayerNorm``, ``nn.Linear``), so a failure is attributed
to the component that causes it. On a failure the check tries the common ways hand-written code
goes wrong (:data:`ATTENTION_FAULTS`, mask shifts, ...) and names the one that reproduces the
measured output ("scores divided by d_model instead of sqrt(d_k)", "causal mask shifted by +1:
position i attends to position i+1").

The reference computations run in float64; a component passes when max |component - reference|
<= atol + rtol * max |reference| with :data:`ATOL`, :data:`RTOL` (float32 rounding inside a
component, such as a float32 softmax, stays far below; every fault this module knows is above).

Sources: Vaswani et al. 2017 §3.2-3.5; Ba et al. 2016 (LayerNorm); Xiong et al. 2020 (pre-/post-norm);
PyTorch ``nn.MultiheadAttention`` / ``nn.LayerNorm`` / ``nn.Linear``; the seed notes' bugs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

from .config import ModelConfig
from .probes import _fmt
from .registry import Component, Registry

#: slot -> what every component of the slot must compute (unless it declares otherwise).
SLOT_REFERENCES: dict[str, str] = {
    "attention": "scaled dot-product multi-head attention: nn.MultiheadAttention with in_proj_weight = "
                 "[w_q; w_k; w_v] and out_proj = w_o, softmax(Q K^T / sqrt(d_k)) over the keys, masks applied "
                 "with ctx.mask.apply before the softmax (Vaswani et al. 2017 §3.2)",
    "mask": "causal: query position i attends to key positions j <= i, itself included, never j > i; padding: no "
            "real query attends to a padded key; every row of a real batch finite; a row whose every key is "
            "blocked as declared by fully_masked_row",
    "layer_norm": "nn.LayerNorm(d_model): (x - mean) / sqrt(biased variance + eps) * weight + bias over the last "
                  "dimension (Ba et al. 2016)",
    "norm": "final_norm = False: post-norm LayerNorm(x + sublayer(x)); final_norm = True: pre-norm "
            "x + sublayer(LayerNorm(x)) and a final LayerNorm after each stack (Xiong et al. 2020)",
    "positional": "x * sqrt(d_model) + PE[:L] with the sinusoidal PE of Vaswani et al. 2017 §3.5, dropout after",
    "embedding": "src(ids) = src.weight[ids] and tgt(ids) = tgt.weight[ids], one lookup per token and nothing "
                 "else; logits(x) = x generator.weight^T + generator.bias (Vaswani et al. 2017 §3.4)",
    "projections": "linear(d_in, d_out) returns an nn.Linear-like module: y = x weight^T (+ bias), weight "
                   "(d_out, d_in)",
}

ATOL = 1e-5  #: absolute floor of every component check (output units)
RTOL = 1e-4  #: relative part, times max |reference|

# verdicts of a component check
CONFORMS = "conforms"
DECLARED = "differs as declared"
VIOLATES = "violates its slot"
NO_DIFF = "no difference (declared different)"
CRASHES = "crashes"
FLAGGED = "flagged (declared bug)"
NOT_FLAGGED = "NOT flagged (declared bug)"


@dataclass
class ComponentResult:
    """One component held to its slot's reference (or to what it declares).

    ``max_abs`` is max |component - reference| in the compared output's unit; ``diagnosis`` names
    the fault when one of the known faults reproduces the output.
    """

    slot: str
    name: str
    plugin: str
    declared: str
    check: str
    verdict: str
    ok: bool
    max_abs: float | None = None
    threshold: float | None = None
    diagnosis: str = ""
    detail: str = ""
    buggy: bool = False

    def reason(self) -> str:
        """One line for failure lists: the component, the check and the fault."""
        what = self.diagnosis or self.detail or self.verdict
        size = "" if self.max_abs is None else f" (max |Δ| {_fmt(self.max_abs)}, threshold {_fmt(self.threshold)})"
        return f"{self.slot}={self.name} [{self.check}]: {what}{size}"


def _gap(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(max |out - ref|, threshold) in float64; inf when shapes differ or NaN/inf appear."""
    if out.shape != ref.shape:
        return math.inf, ATOL
    d = (out.double() - ref.double()).abs()
    d = torch.nan_to_num(d, nan=math.inf)
    scale = float(ref.double().abs().max()) if ref.numel() else 0.0
    return (float(d.max()) if d.numel() else 0.0), ATOL + RTOL * scale


# --------------------------------------------------------------------------- reference siblings

class ReferenceMask:
    """The harness's own mask: bool keep-masks (True = attend), blocked scores set to -inf.

    ``src_mask`` (B, 1, 1, S), ``tgt_mask`` (B, 1, T, T) (padding & causal, itself included).
    Used as the sibling of an attention component checked on its own.
    """

    def src_mask(self, src: torch.Tensor, pad: int) -> torch.Tensor:
        return (src != pad)[:, None, None, :]  # (B, 1, 1, S)

    def tgt_mask(self, tgt: torch.Tensor, pad: int) -> torch.Tensor:
        t = tgt.size(1)
        causal = torch.ones(t, t, dtype=torch.bool, device=tgt.device).tril()  # (T, T)
        return (tgt != pad)[:, None, None, :] & causal  # (B, 1, T, T)

    def apply(self, scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return scores.masked_fill(~mask, float("-inf"))


def sinusoidal_pe(length: int, d_model: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(...) (Vaswani §3.5); (length, D) float64."""
    pos = torch.arange(length, dtype=torch.float64)[:, None]  # (L, 1)
    div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * -(math.log(10000.0) / d_model))
    pe = torch.zeros(length, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div[: d_model // 2])
    return pe


def reference_components(**overrides: Component) -> dict[str, Component]:
    """Sibling components for checking one component on its own: the harness's reference mask,
    ``nn.LayerNorm`` and biased ``nn.Linear``; ``overrides`` puts the component under test in its slot."""
    base = {
        "mask": Component("_reference", "mask", lambda ctx: ReferenceMask()),
        "layer_norm": Component("_reference", "layer_norm", lambda ctx: nn.LayerNorm(ctx.cfg.d_model)),
        "projections": Component("_reference", "projections", lambda ctx: nn.Linear),
    }
    base.update(overrides)
    return base


def _ctx(cfg: ModelConfig, comps: dict[str, Component]):
    from .model import BuildContext

    return BuildContext(cfg, comps)


class OutsideCanonicalLayout(Exception):
    """A component owns parameters that its canonical state does not export."""


def uncovered_parameters(module: nn.Module) -> list[str]:
    """Names of ``module``'s parameters that no canonical name reaches (see :mod:`harness.model`).

    Every parameter must be canonical: the checks set the canonical state to random values, so a
    parameter outside it keeps its initial value during every check -- a gate that starts at 0 can
    hide anything behind it until training moves it."""
    from .model import canonical_state_dict

    covered = {id(t) for t in canonical_state_dict(module).values()}
    covered |= {t.data_ptr() for t in canonical_state_dict(module).values() if isinstance(t, torch.Tensor)}
    return [n for n, p in module.named_parameters() if id(p) not in covered and p.data_ptr() not in covered]


def _random_state(module: nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Load random canonical parameters into ``module`` (LayerNorm gains away from 1, see
    :func:`harness.checks.draw_reference_state`) and return the canonical state as loaded.

    Raises:
        OutsideCanonicalLayout: the module has parameters outside its canonical state.
    """
    from .checks import draw_reference_state
    from .model import canonical_state_dict, load_canonical_state_dict

    hidden = uncovered_parameters(module)
    if hidden:
        raise OutsideCanonicalLayout(
            f"parameter(s) {', '.join(hidden[:3])} are outside the canonical layout: the checks cannot set them, so "
            f"whatever they control (e.g. a gate that starts at 0) is never tested; export them from "
            f"canonical_state() or declare the component's difference")
    names = canonical_state_dict(module)
    load_canonical_state_dict(module, draw_reference_state({k: tuple(v.shape) for k, v in names.items()}, seed))
    return {k: v.detach().clone() for k, v in canonical_state_dict(module).items()}


# --------------------------------------------------------------------------- attention

def reference_attention(query: torch.Tensor, kv: torch.Tensor, state: dict[str, torch.Tensor], h: int,
                        keep: torch.Tensor, fault: str = "") -> torch.Tensor:
    """Multi-head attention in float64 from canonical weights, optionally with one known ``fault``.

    Args:
        query: (B, Tq, D); kv: (B, Tk, D) (keys and values).
        state: ``w_q, w_k, w_v, w_o`` ``.weight`` (D, D) and optional ``.bias`` (D,).
        keep: (B, 1, Tq, Tk) bool, True = attend.
        fault: "" for the reference, else a key of :data:`ATTENTION_FAULTS`.

    Returns: (B, Tq, D) float64.
    """
    b, tq, d = query.shape
    tk, d_k = kv.size(1), d // h

    def lin(x, n):
        w = state[f"{n}.weight"].double()
        bias = state.get(f"{n}.bias")
        return F.linear(x.double(), w, None if bias is None else bias.double())

    q, k, v = lin(query, "w_q"), lin(kv, "w_k"), lin(kv, "w_v")
    if fault == "kv_swapped":
        k, v = v, k
    if fault == "k_is_v":
        v = k

    def split(x, length):  # (B, L, D) -> (B, H, L, d_k)
        if fault == "no_transpose":
            return x.reshape(b, h, length, d_k)
        return x.view(b, length, h, d_k).transpose(1, 2)

    q, k, v = split(q, tq), split(k, tk), split(v, tk)
    scale = {"scale_d_model": 1.0 / d, "scale_sqrt_d_model": 1.0 / math.sqrt(d), "no_scale": 1.0,
             "scale_d_k": 1.0 / d_k}.get(fault, 1.0 / math.sqrt(d_k))
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale  # (B, H, Tq, Tk)
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
}

#: Canonical names every attention component must export.
ATTENTION_LAYOUT = ("w_q.weight", "w_k.weight", "w_v.weight", "w_o.weight")


def _attention_inputs(cfg: ModelConfig, seed: int):
    from .checks import padded_batch

    src, tgt, _ = padded_batch(cfg, seed=seed)
    g = torch.Generator().manual_seed(seed + 71)
    b, s, t, d = src.size(0), src.size(1), tgt.size(1), cfg.d_model
    x, mem = torch.randn(b, t, d, generator=g), torch.randn(b, s, d, generator=g)
    return src, tgt, x, mem


def _attention_case(attn: nn.Module, x, kv, mask, dtype: torch.dtype) -> torch.Tensor:
    """The component's output (B, T, D) in ``dtype`` (eval mode, no autograd), as float64."""
    with torch.no_grad():
        return attn.to(dtype)(x.to(dtype), kv.to(dtype), kv.to(dtype), mask).double()


def check_attention(comp: Component, cfg: ModelConfig, seed: int = 0) -> list[ComponentResult]:
    """Attention component on its own (reference mask and ``nn.Linear`` siblings), self-attention
    (causal + padding keep-mask, T x T) and cross-attention (source padding, T x S), run in float64
    and in float32 (a component right in one precision only is wrong), against the float64
    :func:`reference_attention`. Compared at real query rows (padded query rows are never scored).
    Eval mode must be deterministic (no dropout left on). On a difference the known faults
    (:data:`ATTENTION_FAULTS`) are tried for a diagnosis."""
    from .model import canonical_state_dict

    src, tgt, x, mem = _attention_inputs(cfg, seed)
    ctx = _ctx(cfg, reference_components(attention=comp))
    out = []
    real = (tgt != cfg.pad)  # (B, T) real query rows
    for kind in ("self", "cross"):
        label = f"{kind}-attention vs scaled dot-product attention"
        try:
            attn = ctx.make("attention")
            names = canonical_state_dict(attn)
            missing = [n for n in ATTENTION_LAYOUT if n not in names]
            if missing:
                out.append(_result(comp, label, VIOLATES, False, detail=(
                    f"does not export the canonical layout (missing {', '.join(missing)}; has "
                    f"{', '.join(sorted(names)) or 'nothing'}): define canonical_state()/load_canonical_state()")))
                continue
            state = _random_state(attn, seed)
            attn = attn.eval()
            kv = x if kind == "self" else mem
            mask = (ReferenceMask().tgt_mask(tgt, cfg.pad) if kind == "self"
                    else ReferenceMask().src_mask(src, cfg.pad))
            keep = mask.expand(x.size(0), 1, x.size(1), kv.size(1))
            ref = reference_attention(x, kv, state, cfg.h, keep)
            runs = {prec: _attention_case(attn, x, kv, mask, dt) for prec, dt in
                    (("float64", torch.float64), ("float32", torch.float32))}
            again = _attention_case(attn, x, kv, mask, torch.float64)
        except Exception as exc:  # noqa: BLE001 - a crash is a result
            out.append(_crash(comp, label, exc))
            continue
        if not torch.equal(torch.nan_to_num(again), torch.nan_to_num(runs["float64"])):
            out.append(_result(comp, label, VIOLATES, False, _gap(again, runs["float64"])[0], 0.0, diagnosis=(
                "eval mode is not deterministic: two identical calls differ (dropout left on in eval mode, "
                "e.g. F.dropout without training=self.training)")))
            continue
        gaps = {prec: _gap(got[real], ref[real]) for prec, got in runs.items()}
        prec = max(gaps, key=lambda k: gaps[k][0] / gaps[k][1])
        gap, thr = gaps[prec]
        diagnosis = ""
        if gap > thr:
            diagnosis = _diagnose_attention(runs[prec][real], x, kv, state, cfg.h, keep, real)
            if gaps["float64"][0] <= gaps["float64"][1]:
                diagnosis = f"right in float64 but not in float32 ({diagnosis or 'unknown fault'})"
        out.append(_judge(comp, label, gap, thr, diagnosis))
    return out


def _diagnose_attention(got: torch.Tensor, x, kv, state, h: int, keep, real) -> str:
    """The first :data:`ATTENTION_FAULTS` entry that reproduces ``got`` (rows at ``real``), compared
    where ``got`` is finite; "" when none does."""
    finite = torch.isfinite(got)
    note = "" if finite.all() else " (and NaN or inf in the output)"
    if not finite.any():
        return "the output is NaN or inf at every real query row"
    for fault, text in ATTENTION_FAULTS.items():
        alt = reference_attention(x, kv, state, h, keep, fault)[real]
        g2, t2 = _gap(got[finite], alt[finite])
        if g2 <= t2:
            return text + note
    return "NaN or inf in the output at real query rows" if note else ""


# --------------------------------------------------------------------------- mask

def _describe(exc: BaseException) -> str:
    from .checks import describe_exception

    return describe_exception(exc)


def _crash(comp: Component, label: str, exc: BaseException) -> ComponentResult:
    """A component check that raised: a layout violation, or a crash."""
    if isinstance(exc, OutsideCanonicalLayout):
        return _result(comp, label, VIOLATES, False, diagnosis=str(exc))
    return _result(comp, label, CRASHES, False, detail=f"crashes: {_describe(exc)}")


def check_mask(comp: Component, cfg: ModelConfig, seed: int = 0) -> list[ComponentResult]:
    """A mask component's semantics, probed without a reference implementation.

    On two padded batches of different shapes (B, S, T): softmax(apply(scores, mask)) at real
    query rows must give zero weight exactly to the blocked keys (padded keys; for the target also
    later positions) and match the reference masked softmax; every row of the batch, padded query
    rows included, must be finite (a NaN there reaches the gradients); a source made only of
    padding must give what ``fully_masked_row`` declares. The diagnosis names the pattern
    (shifted causal mask, padding ignored, mask inverted).
    """
    from .checks import padded_batch

    out: list[ComponentResult] = []
    style = _ctx(cfg, reference_components(mask=comp)).make("mask")
    g = torch.Generator().manual_seed(seed + 41)
    problems = {"padding": [], "causal": [], "finite": []}
    worst = {"padding": 0.0, "causal": 0.0}
    for bs, s_len, t_len, bseed in ((4, 9, 10, seed), (3, 7, 12, seed + 1)):
        src, tgt, _ = padded_batch(cfg, bs, s_len, t_len, seed=bseed)
        b, s, t, h = src.size(0), src.size(1), tgt.size(1), cfg.h
        rows = (tgt != cfg.pad)[:, None, :].expand(b, h, t)  # (B, H, T) real query rows
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        cases = {"padding": (torch.randn(b, h, t, s, generator=g), lambda: style.src_mask(src, cfg.pad),
                             (src != cfg.pad)[:, None, None, :].expand(b, h, t, s)),
                 "causal": (torch.randn(b, h, t, t, generator=g), lambda: style.tgt_mask(tgt, cfg.pad),
                            ((tgt != cfg.pad)[:, None, None, :] & causal).expand(b, h, t, t))}
        for kind, (scores, make, keep) in cases.items():
            try:
                p = style.apply(scores.clone(), make()).float().softmax(-1)  # (B, H, T, K)
            except Exception as exc:  # noqa: BLE001
                problems[kind].append(f"crashes: {_describe(exc)}")
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
            if err > 1e-6:
                problems[kind].append(diagnose_mask(kind, p, keep, rows, cfg, src, tgt))
    for kind in ("padding", "causal"):
        label = f"{kind} semantics (softmax at real query rows)"
        msgs = list(dict.fromkeys(problems[kind]))
        if msgs:
            out.append(_result(comp, label, VIOLATES, False, worst[kind], 1e-6, diagnosis=msgs[0],
                               detail="; ".join(msgs[1:])))
        else:
            out.append(_result(comp, label, CONFORMS, True, worst[kind], 1e-6))
    msgs = list(dict.fromkeys(problems["finite"]))
    out.append(_result(comp, "finite rows of a real batch", VIOLATES if msgs else CONFORMS, not msgs,
                       diagnosis=msgs[0] if msgs else "", detail="; ".join(msgs[1:])))
    out.append(_fully_masked_row(comp, style, cfg, g))
    return out


def _classify_row(p: torch.Tensor) -> str:
    if torch.isnan(p).all():
        return "nan"
    if not torch.isfinite(p).all():
        return "partly nan"
    if (p == 0).all():
        return "zeros"
    if torch.allclose(p, torch.full_like(p, 1.0 / p.size(-1)), atol=1e-6):
        return "uniform"
    return "finite"


def _fully_masked_row(comp: Component, style, cfg: ModelConfig, g: torch.Generator) -> ComponentResult:
    label = "fully masked row (a source of padding only)"
    row = torch.full((1, 6), cfg.pad)
    try:
        got = _classify_row(style.apply(torch.randn(1, 1, 1, 6, generator=g), style.src_mask(row, cfg.pad))
                            .float().softmax(-1))
    except Exception as exc:  # noqa: BLE001
        return _result(comp, label, CRASHES, False, detail=f"crashes: {_describe(exc)}")
    want = comp.fully_masked_row
    ok = got == want or (want == "finite" and got in ("uniform", "zeros", "finite"))
    detail = f"gives {got}" + ("" if ok else
                               f", but the component declares fully_masked_row={want!r} (declare "
                               f"fully_masked_row={got!r} in its Component(...) if that is intended)")
    return _result(comp, label, CONFORMS if ok else VIOLATES, ok, diagnosis="" if ok else detail, detail=detail)


def diagnose_mask(kind: str, p: torch.Tensor, keep: torch.Tensor, rows: torch.Tensor, cfg: ModelConfig,
                  src: torch.Tensor, tgt: torch.Tensor) -> str:
    """Name what a mask does wrong from the attention weights ``p`` (B, H, Tq, Tk) at real query
    ``rows`` (B, H, Tq) against the intended ``keep`` (B, H, Tq, Tk)."""
    seen = (p > 1e-6) & rows[..., None]  # attended keys at real rows
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
    if torch.allclose(p[rows], uniform[rows], atol=1e-6):
        return f"the {kind} mask blocks every key: attention is uniform (mask inverted or all-blocked)"
    if torch.equal(seen, rows[..., None].expand_as(seen)) and not torch.equal(want, seen):
        return (f"the {kind} mask blocks nothing: padded{' and future' if kind == 'causal' else ''} keys get "
                f"attention weight up to {_fmt(float(p[~keep & rows[..., None]].max()))} (mask not applied)")
    leak = seen & ~want
    if kind == "padding" and leak.any() and torch.equal(seen & real_keys, want & real_keys):
        return (f"source padding ignored: real query rows attend to padded keys (weight up to "
                f"{_fmt(float(p[leak].max()))})")
    if kind == "causal" and leak.any():
        b_, h_, i_, j_ = (int(x) for x in leak.nonzero()[0])
        what = "a later position" if j_ > i_ else "a padded key"
        return f"target mask leaks: position {i_} attends to position {j_} ({what}) in row {b_}"
    missing = want & ~seen
    if missing.any():
        b_, h_, i_, j_ = (int(x) for x in missing.nonzero()[0])
        return f"the {kind} mask blocks a key it must keep: position {i_} cannot attend to real key {j_} (row {b_})"
    return f"the {kind} mask's weights differ from the reference masked softmax at real query rows"


# --------------------------------------------------------------------------- layer_norm, norm

def check_layer_norm(comp: Component, cfg: ModelConfig, seed: int = 0) -> list[ComponentResult]:
    """``layer_norm`` component vs ``nn.LayerNorm(D)`` holding the same (random) weight and bias, on
    inputs with non-zero mean and varied scale, float64."""
    label = "vs nn.LayerNorm(d_model)"
    try:
        mod = comp.factory(_ctx(cfg, reference_components(layer_norm=comp)))
        state = _random_state(mod, seed)
        ref = nn.LayerNorm(cfg.d_model).double()
        with torch.no_grad():
            ref.weight.copy_(state.get("weight", torch.ones(cfg.d_model)))
            ref.bias.copy_(state.get("bias", torch.zeros(cfg.d_model)))
        g = torch.Generator().manual_seed(seed + 83)
        x = (torch.randn(3, 7, cfg.d_model, generator=g) * torch.rand(3, 7, 1, generator=g) * 4
             + torch.randn(3, 7, 1, generator=g)).double()
        with torch.no_grad():
            got, want = mod.double().eval()(x), ref(x)
    except Exception as exc:  # noqa: BLE001
        return [_crash(comp, label, exc)]
    gap, thr = _gap(got, want)
    diagnosis = ""
    if gap > thr:
        w, b = ref.weight.detach(), ref.bias.detach()
        mu = x.mean(-1, keepdim=True)
        hyps = {"unbiased variance (n - 1) instead of the biased one": (x - mu) / torch.sqrt(x.var(-1, keepdim=True) + 1e-5) * w + b,
                "no mean subtraction (RMS normalisation)": x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w + b,
                "normalised over the sequence axis instead of d_model": (x - x.mean(-2, keepdim=True)) / torch.sqrt(x.var(-2, unbiased=False, keepdim=True) + 1e-5) * w + b,
                "normalised over (L, d_model) instead of d_model alone": (x - x.mean((-2, -1), keepdim=True)) / torch.sqrt(x.var((-2, -1), unbiased=False, keepdim=True) + 1e-5) * w + b,
                "unbiased std with eps added outside the square root": (x - mu) / (x.std(-1, keepdim=True) + 1e-6) * w + b,
                "weight and bias not applied": F.layer_norm(x, (cfg.d_model,))}
        for text, alt in hyps.items():
            g2, t2 = _gap(got, alt)
            if g2 <= max(t2, 1e-3 * float(alt.abs().max())):
                diagnosis = text
                break
    return [_judge(comp, label, gap, thr, diagnosis)]


def check_norm(comp: Component, cfg: ModelConfig, seed: int = 0) -> list[ComponentResult]:
    """``norm`` component (residual block) vs the formula its ``final_norm`` claims: post-norm
    LayerNorm(x + f(x)) when False, pre-norm x + f(LayerNorm(x)) when True, with the reference
    ``nn.LayerNorm`` as its LayerNorm and a fixed random sub-layer f; eval mode, float64."""
    label = "residual block vs the formula final_norm claims"
    try:
        mod = comp.factory(_ctx(cfg, reference_components(norm=comp)))
        final = getattr(type(mod), "final_norm", None)
        if not isinstance(final, bool):
            return [(_result(comp, label, VIOLATES, False, detail=(
                "the module has no class attribute final_norm: bool (True = pre-norm with a final LayerNorm)")))]
        state = _random_state(mod, seed)
        if "norm.weight" not in state:
            return [(_result(comp, label, VIOLATES, False, detail=(
                f"no LayerNorm child named 'norm' made with ctx.layer_norm() (canonical names: "
                f"{', '.join(sorted(state)) or 'none'})")))]
        ln = nn.LayerNorm(cfg.d_model).double()
        with torch.no_grad():
            ln.weight.copy_(state["norm.weight"])
            ln.bias.copy_(state.get("norm.bias", torch.zeros(cfg.d_model)))
        g = torch.Generator().manual_seed(seed + 89)
        f = nn.Linear(cfg.d_model, cfg.d_model).double()
        with torch.no_grad():
            f.weight.copy_(torch.randn(cfg.d_model, cfg.d_model, generator=g) / math.sqrt(cfg.d_model))
            f.bias.copy_(torch.randn(cfg.d_model, generator=g))
        sub = lambda y: torch.tanh(f(y))  # noqa: E731
        x = (torch.randn(3, 5, cfg.d_model, generator=g) * 2 + 0.5).double()
        with torch.no_grad():
            got = mod.double().eval()(x, sub)
            post, pre = ln(x + sub(x)), x + sub(ln(x))
    except Exception as exc:  # noqa: BLE001
        return [_crash(comp, label, exc)]
    want, other = (pre, post) if final else (post, pre)
    gap, thr = _gap(got, want)
    diagnosis = ""
    if gap > thr:
        g2, t2 = _gap(got, other)
        claims = "final_norm = True (pre-norm)" if final else "final_norm = False (post-norm)"
        if g2 <= t2:
            diagnosis = (f"computes {'post-norm LayerNorm(x + sublayer(x))' if final else 'pre-norm x + sublayer(LayerNorm(x))'}"
                         f" but declares {claims}: the stacks would get the wrong final LayerNorm")
        else:
            diagnosis = f"matches neither post-norm nor pre-norm (declares {claims})"
    return [_judge(comp, label, gap, thr, diagnosis)]


# --------------------------------------------------------------------------- positional, embedding, projections

def check_positional(comp: Component, cfg: ModelConfig, seed: int = 0) -> list[ComponentResult]:
    """``positional`` component vs x * sqrt(D) + PE[:L] (eval mode, float64), at two lengths."""
    label = "vs x * sqrt(d_model) + PE[:L]"
    g = torch.Generator().manual_seed(seed + 97)
    gaps, diagnosis = [], ""
    try:
        mod = comp.factory(_ctx(cfg, reference_components(positional=comp)))
        _random_state(mod, seed)
        mod = mod.double().eval()
        for length in (5, min(cfg.max_len, 11)):
            x = torch.randn(2, length, cfg.d_model, generator=g).double()
            with torch.no_grad():
                got = mod(x)
            pe = sinusoidal_pe(length + 1, cfg.d_model)
            gaps.append(_gap(got, x * math.sqrt(cfg.d_model) + pe[:length]))
            if gaps[-1][0] > gaps[-1][1] and not diagnosis:
                hyps = {"PE shifted by one position (PE[1:L+1])": x * math.sqrt(cfg.d_model) + pe[1:length + 1],
                        "no sqrt(d_model) scaling of the embeddings": x + pe[:length],
                        "embeddings scaled by d_model instead of sqrt(d_model)": x * cfg.d_model + pe[:length],
                        "no positional encoding added": x * math.sqrt(cfg.d_model)}
                for text, alt in hyps.items():
                    g2, t2 = _gap(got, alt)
                    if g2 <= t2:
                        diagnosis = text
                        break
    except Exception as exc:  # noqa: BLE001
        return [_crash(comp, label, exc)]
    gap, thr = max(gaps, key=lambda gt: gt[0] / gt[1])
    return [_judge(comp, label, gap, thr, diagnosis)]


def check_embedding(comp: Component, cfg: ModelConfig, seed: int = 0) -> list[ComponentResult]:
    """``embedding`` component: src/tgt must be per-token lookups of the canonical ``src.weight`` /
    ``tgt.weight`` on a padded batch (a value that depends on other tokens of the row, such as the
    sequence length, can carry future information past the causal mask), and ``logits`` must be
    x generator.weight^T + generator.bias."""
    from .checks import padded_batch

    label = "lookups and generator vs the canonical matrices"
    try:
        mod = comp.factory(_ctx(cfg, reference_components(embedding=comp)))
        state = _random_state(mod, seed)
        mod = mod.double().eval()
        src, tgt, _ = padded_batch(cfg, seed=seed)
        x = torch.randn(2, 3, cfg.d_model, generator=torch.Generator().manual_seed(seed + 101)).double()
        with torch.no_grad():
            parts = {"src": (mod.src(src), state["src.weight"].double()[src]),
                     "tgt": (mod.tgt(tgt), state["tgt.weight"].double()[tgt]),
                     "logits": (mod.logits(x), F.linear(x, state["generator.weight"].double(),
                                                        state["generator.bias"].double()
                                                        if "generator.bias" in state else None))}
    except KeyError as exc:
        return [(_result(comp, label, VIOLATES, False, detail=(
            f"canonical parameter {exc} missing: export src.weight, tgt.weight, generator.weight (and "
            f"generator.bias) from canonical_state()")))]
    except Exception as exc:  # noqa: BLE001
        return [_crash(comp, label, exc)]
    worst, diagnosis = (0.0, ATOL), ""
    for part, (got, want) in parts.items():
        gap, thr = _gap(got, want)
        if gap / thr > worst[0] / worst[1]:
            worst = (gap, thr)
        if gap > thr and not diagnosis:
            diagnosis = (f"{part}(ids) is not a per-token lookup of {part}.weight: the value at a position depends on "
                         f"other tokens of its row (e.g. the sequence length), which lets the decoder see the future "
                         f"past the causal mask" if part in ("src", "tgt") else
                         "logits(x) differs from x generator.weight^T + generator.bias")
    return [_judge(comp, label, worst[0], worst[1], diagnosis)]


def check_projections(comp: Component, cfg: ModelConfig, seed: int = 0) -> list[ComponentResult]:
    """``projections`` component: ``linear(d_in, d_out)`` must return a module with ``weight``
    (d_out, d_in) (and optional ``bias`` (d_out,)) computing x weight^T + bias (float64)."""
    label = "linear(d_in, d_out) vs x weight^T + bias"
    try:
        linear = comp.factory(_ctx(cfg, reference_components(projections=comp)))
        d_in, d_out = cfg.d_model, 2 * cfg.d_model
        lin = linear(d_in, d_out).double()
        w, b = getattr(lin, "weight", None), getattr(lin, "bias", None)
        if not isinstance(w, torch.Tensor) or tuple(w.shape) != (d_out, d_in):
            return [(_result(comp, label, VIOLATES, False, detail=(
                f"linear({d_in}, {d_out}) must have weight of shape ({d_out}, {d_in}); got "
                f"{None if w is None else tuple(w.shape)}")))]
        x = torch.randn(3, 4, d_in, generator=torch.Generator().manual_seed(seed + 103)).double()
        with torch.no_grad():
            got, want = lin(x), F.linear(x, w, b)
    except Exception as exc:  # noqa: BLE001
        return [_crash(comp, label, exc)]
    gap, thr = _gap(got, want)
    return [_judge(comp, label, gap, thr)]


# --------------------------------------------------------------------------- verdicts

def _result(comp: Component, check: str, verdict: str, ok: bool, max_abs: float | None = None,
            threshold: float | None = None, diagnosis: str = "", detail: str = "") -> ComponentResult:
    return ComponentResult(comp.slot, comp.name, comp.plugin, comp.declaration(), check, verdict, ok, max_abs,
                           threshold, diagnosis, detail, comp.buggy)


def _judge(comp: Component, check: str, gap: float, thr: float, diagnosis: str = "") -> ComponentResult:
    """Verdict from the measured gap and the component's declaration."""
    differs = gap > thr
    if comp.differs or comp.equivalent_to:
        # declared: report the size; held to another component: judged by the pair checks
        verdict = DECLARED if differs else NO_DIFF
        note = ("" if differs else "declared different but matches the slot's reference within tolerance "
                "(drop differs= from its registration)") if comp.differs else f"held to {comp.equivalent_to}"
        return _result(comp, check, verdict, True, gap, thr, diagnosis, note)
    if differs:
        return _result(comp, check, VIOLATES, False, gap, thr, diagnosis or
                       f"differs from the slot's reference ({SLOT_REFERENCES[comp.slot].split(':')[0]})")
    return _result(comp, check, CONFORMS, True, gap, thr)


#: slot -> the check that holds a component of the slot to its reference.
SLOT_CHECKS: dict[str, Callable[..., list[ComponentResult]]] = {
    "attention": check_attention,
    "mask": check_mask,
    "layer_norm": check_layer_norm,
    "norm": check_norm,
    "positional": check_positional,
    "embedding": check_embedding,
    "projections": check_projections,
}


def check_component(comp: Component, cfg: ModelConfig, seed: int = 0) -> list[ComponentResult]:
    """Hold one component to its slot's reference (:data:`SLOT_CHECKS`). Never raises for a
    failing component; a slot without a check gives no result."""
    fn = SLOT_CHECKS.get(comp.slot)
    return fn(comp, cfg, seed) if fn else []


def check_components(registry: Registry, keys: list[tuple[str, str]], cfg: ModelConfig,
                     seed: int = 0) -> list[ComponentResult]:
    """:func:`check_component` for each ``(slot, name)`` in ``keys``."""
    import dataclasses

    out = []
    for slot, name in keys:
        comp = registry.component(slot, name)
        if comp.equivalent_to and reference_key(registry, slot, name, cfg).startswith("reference"):
            # equivalent to a component held to the reference: held to the reference itself
            comp = dataclasses.replace(comp, equivalent_to="")
        out += check_component(comp, cfg, seed)
    return out


# --------------------------------------------------------------------------- declared relations

def reference_key(registry: Registry, slot: str, name: str, cfg: ModelConfig | None = None,
                  _seen: frozenset = frozenset()) -> str:
    """What a component claims to compute, as a key: two components of a slot with the same key are
    expected to compute the same function.

    ``"reference"`` for a component that declares nothing (for ``norm``: ``"reference:pre"`` or
    ``"reference:post"`` from its ``final_norm``), the target's key for ``equivalent_to=``, and
    ``"own:<name>"`` for a declared difference or a declared bug.
    """
    comp = registry.component(slot, name)
    if comp.buggy or comp.differs:
        return f"own:{name}"
    if comp.equivalent_to and comp.equivalent_to not in _seen:
        return reference_key(registry, slot, comp.equivalent_to, cfg, _seen | {name})
    if slot == "norm":
        from .checks import CHECK_MODEL

        try:
            mod = comp.factory(_ctx(cfg or CHECK_MODEL, reference_components(norm=comp)))
            return "reference:pre" if getattr(type(mod), "final_norm", False) else "reference:post"
        except Exception:  # noqa: BLE001 - a norm that cannot be built is its own function
            return f"own:{name}"
    return "reference"


def declared_groups(registry: Registry, cfg: ModelConfig | None = None) -> dict[str, tuple[frozenset[str], ...]]:
    """slot -> groups of components declared to compute the same function (same :func:`reference_key`),
    from the registrations alone. Components alone in their group are omitted."""
    out: dict[str, dict[str, set[str]]] = {}
    for (slot, name) in registry.components:
        key = reference_key(registry, slot, name, cfg)
        out.setdefault(slot, {}).setdefault(key, set()).add(name)
    return {slot: tuple(frozenset(g) for g in groups.values() if len(g) > 1) for slot, groups in out.items()}
