"""What each stage of the check computes (its ``run``) and which of its results fail (its
``failures``); :mod:`harness.checks.stages` registers them, :mod:`harness.checks.render` renders
them. Every ``run_*`` takes a :class:`~harness.checks.report.CheckContext`, every ``*_failures``
a :class:`~harness.checks.report.CheckReport`.
"""
from __future__ import annotations

import dataclasses
import itertools
import math

import torch

from ..registry import Variant
from .contract_variant import variant_contract
from .contracts import check_contracts
from .inputs import describe_exception, fmt_size, long_rows_of
from .masks import MaskComponentResult, mask_result
from .mha import compare_attention_with_mha
from .pairs import CRASHES, NOT_COMPARABLE, UNEXPECTED, PairResult, ReferenceResult, compare_outputs, kink_note, \
    layout_relation, max_abs_diff, not_comparable
from .expectations import expected_relation
from .policy import Tolerance, get_tolerance
from .properties.measure import ProbeResult
from .properties.table import ProbeInputs, run_properties
from .report import BugResult, CheckContext, CheckReport
from .runs import CheckSession, VariantRun, layout_conflict, load_variant, run_variant
from .ties import TieResult, check_ties
from .transformer_lm import compare_stack_with_torch


# --------------------------------------------------------------------------- runs

def run_components(ctx: CheckContext):
    """Each component in scope against its slot's reference (:mod:`harness.checks.contracts`)."""
    return check_contracts(ctx.registry, ctx.keys, ctx.session.cfg, ctx.seed)


def run_variants(ctx: CheckContext) -> dict[str, VariantRun]:
    """Every variant (buggy ones too) on the check batch, holding the one reference state."""
    ctx.session.load_state(ctx.variants)
    for v in ctx.variants:
        ctx.session.run(v)
    return ctx.session.runs


def run_pairs(ctx: CheckContext) -> list[PairResult]:
    return pairs_of(ctx.session, ctx.clean)


def pairs_of(s: CheckSession, clean: list[Variant]) -> list[PairResult]:
    """Every pair of the (non-buggy) variants, judged against what their slots declare."""
    pairs = []
    for a, b in itertools.combinations(clean, 2):
        ra, rb = s.runs[a.name], s.runs[b.name]
        conflict = layout_conflict(a.name, b.name, s.shapes)
        if conflict:
            pairs.append(not_comparable(a.name, b.name, *expected_relation(a, b, s.declared()), conflict))
            continue
        rel, declared = layout_relation(ra, rb, *expected_relation(a, b, s.declared()))
        res = compare_outputs(ra, rb, rel, declared, s.tol, s.keep)
        if not res.ok and res.logits is not None and res.logits.within:  # only a gradient is off
            res = _drawn_again(s, a, b, res)
        pairs.append(_on_task_rows(s, a, b, res) if res.ok and rel == "equivalent" else res)
    return pairs


def _drawn_again(s: CheckSession, a: Variant, b: Variant, res: PairResult) -> PairResult:
    """A pair whose logits agree but a gradient does not, compared again on a second reference state and batch
    (seed + 1): a ReLU input within float32 rounding of 0 takes the other side in one run and moves one gradient
    entry far beyond rounding on one draw only (as against nn.Transformer, docs/checks.md); a real difference
    recurs. The second result when it passes (with a note), else ``res``."""
    other = CheckSession.create(s.registry, s.cfg, device=s.device, dtype=s.dtype, seed=s.seed + 1, groups=s.groups)
    other.load_state([a, b])
    ra, rb = other.run(a), other.run(b)
    if ra.error or rb.error:
        return res
    again = compare_outputs(ra, rb, res.expected, res.declared, s.tol, other.keep)
    if not again.ok:
        return res
    return dataclasses.replace(again, notes=[kink_note(res.grad_worst, f"{b.name}'s")] + again.notes)


def _on_task_rows(s: CheckSession, a: Variant, b: Variant, res: PairResult) -> PairResult:
    """A pair equivalent on the drawn batch, compared again on the rows the task drew (their own forward): the
    result there when it fails ("on rows the task drew"), else ``res``."""
    ta, tb = s.run_task(a), s.run_task(b)
    if ta is None or tb is None or ta.error or tb.error:
        return res
    again = compare_outputs(ta, tb, res.expected, res.declared, s.tol, s.task_rows[1] != s.cfg.pad)
    return res if again.ok else dataclasses.replace(
        again, notes=["on rows the task drew (their own forward; the drawn batch: within)"] + again.notes)


def run_model_probes(ctx: CheckContext) -> list[ProbeResult]:
    """The model-level probes on every variant that runs, each with its model-level contract
    (:func:`~harness.checks.contract_variant.variant_contract`: logits, gradients, canonical round
    trip, same seed). The conformance kit (:mod:`harness.testing`) runs these same stages."""
    s = ctx.session
    return [p for v in ctx.variants if not s.runs[v.name].error
            for p in probe_model(s, v) + variant_contract(s, v)]


def _threshold_for(run: VariantRun, tol: Tolerance, keep) -> float:
    """A variant's own logit threshold: ``max(atol, fudge * ref_error)`` at the ``keep`` positions."""
    if run.logits is None:
        return tol.atol
    ref = max_abs_diff(run.logits[keep].double(), run.logits64[keep].double())
    return tol.threshold(ref)


def probe_model(s: CheckSession, v: Variant) -> list[ProbeResult]:
    """The probes of ``probe`` rows of :data:`harness.checks.properties.catalogue.PROPERTIES` that run in ``check`` on ``v`` holding the session's state."""
    thr = _threshold_for(s.runs[v.name], s.tol, s.keep)
    try:
        model, _ = load_variant(s.registry, v, s.cfg, s.state_for(v.name))
        return run_properties(ProbeInputs(model.to(s.device), s.short, s.cfg, thr, device=s.device, dtype=s.dtype,
                                          seed=s.seed, name=v.name, long=long_rows_of(s.batch, s.short[0].size(0)),
                                          task=s.task_rows))
    except Exception as exc:  # noqa: BLE001
        return [ProbeResult(v.name, "probes", "-", False, math.inf, thr, f"crashes: {describe_exception(exc)}")]


def run_masks(ctx: CheckContext) -> list[MaskComponentResult]:
    """Each mask component in scope, from its contract results (already measured by ``components``)."""
    components = ctx.results["components"]
    return [mask_result(m, ctx.registry.component("mask", m).buggy,
                        [c for c in components if (c.slot, c.name) == ("mask", m)])
            for (slot, m) in ctx.keys if slot == "mask"]


def run_mha(ctx: CheckContext) -> list[ReferenceResult]:
    """Every attention x mask x projections combination in scope vs ``nn.MultiheadAttention``."""
    s = ctx.session
    out = []
    for att, msk, proj in attention_combos(ctx.variants, ctx.keys):
        out += compare_attention_with_mha(s.registry, att, msk, proj, s.cfg, device=s.device, dtype=s.dtype,
                                          seed=s.seed, groups=s.declared())
    return out


def run_transformer(ctx: CheckContext) -> list[ReferenceResult]:
    """Every variant that builds, its stacks vs PyTorch's: ``nn.Transformer`` (encoder-decoder),
    ``nn.TransformerEncoder`` with the causal or prefix mask (decoder-only, prefix LM)."""
    s = ctx.session
    out = []
    for v in ctx.variants:
        if v.name not in s.build_errors:
            out += compare_stack_with_torch(s.registry, v, s.cfg, s.state_for(v.name), device=s.device, dtype=s.dtype,
                                            seed=s.seed, groups=s.declared())
    return out


def attention_combos(variants, keys) -> list[tuple[str, str, str]]:
    """Every attention x mask x projections component in ``keys`` (the scope: the components the
    variants use, or all), plus every (attention, mask, projections) a selected variant uses."""
    def names(slot):
        return sorted({n for s, n in keys if s == slot})

    combos = {(a, m, p) for a in names("attention") for m in names("mask") for p in names("projections")}
    combos |= {(r["attention"], r["mask"], r["projections"]) for r in (v.resolved() for v in variants)}
    return sorted(combos)


def run_ties(ctx: CheckContext) -> list[TieResult]:
    """Tied parameters of every (non-buggy) variant that runs."""
    s = ctx.session
    return [check_ties(ctx.registry, v, s.cfg, s.state_for(v.name), device=s.device, tol=s.tol, seed=ctx.seed) for v in ctx.clean
            if not s.runs[v.name].error]


def run_devices(ctx: CheckContext) -> list[ReferenceResult]:
    """Each variant on the other device (CPU vs CUDA) against its own run; "no CUDA" rows without one."""
    s, clean = ctx.session, ctx.clean
    if not torch.cuda.is_available():
        return [ReferenceResult(v.name, "cpu vs cuda", NOT_COMPARABLE, "no CUDA", True,
                                detail="torch.cuda.is_available() is False") for v in clean]
    other = torch.device("cpu") if s.device.type == "cuda" else torch.device("cuda")
    tol = get_tolerance(s.dtype, "cuda")
    out = []
    for v in clean:
        theirs = run_variant(s.registry, v, s.cfg, s.state_for(v.name), s.batch, other, s.dtype)
        res = compare_outputs(s.runs[v.name], theirs, "equivalent", [], tol, s.keep)
        out.append(ReferenceResult(v.name, f"{s.device.type} vs {other.type}", "equivalent", res.verdict, res.ok,
                                   res.logits, res.grad_max, res.grad_worst, detail="; ".join(res.notes)))
    return out


def run_bugs(ctx: CheckContext) -> list[BugResult]:
    """Why the checks flag each faithful-bug variant (from the stages before)."""
    r = ctx.results
    return [bug_reasons_of(v, ctx.session, r["probes"], r["mha"], r["transformer"], r["components"])
            for v in ctx.buggy]


def bug_reasons_of(v: Variant, s: CheckSession, probes, mha, transformer, components=()) -> BugResult:
    """Why the checks flag the faithful-bug variant ``v``: its broken components, a crash, leaking
    probes, its attention against nn.MultiheadAttention, its stacks against nn.Transformer."""
    r = v.resolved()
    used = set(r.items())
    reasons = [c.reason() for c in components if not c.ok and (c.slot, c.name) in used]
    run = s.runs[v.name]
    if run.error:
        src, tgt, _ = s.batch
        reasons.append(f"crashes on the padded check batch (B={src.size(0)}, S={src.size(1)}, "
                       f"T={tgt.size(1)}): {run.error}")
    seen_probe = set()
    for p in probes:
        if p.subject == v.name and not p.passed and p.probe not in seen_probe:
            seen_probe.add(p.probe)
            reasons.append(p.detail)
    subject = f"attention={r['attention']}, mask={r['mask']}, projections={r['projections']}"
    for x in mha:
        if x.subject == subject and not x.ok:
            size, thr = (x.output.max_abs, x.output.threshold) if x.output else (None, None)
            what = x.detail if x.verdict == CRASHES else (
                f"output differs from the same weights and masks in nn.MultiheadAttention by "
                f"{fmt_size(size)} (threshold {fmt_size(thr)})")
            reasons.append(f"{x.reference}: {what}")
    for x in transformer:
        if x.subject == v.name and x.verdict in (UNEXPECTED, CRASHES):
            reasons.append(f"{x.reference}: {x.verdict}")
    return BugResult(v.name, v.summary, list(dict.fromkeys(reasons)))


# --------------------------------------------------------------------------- failures (the ok predicates)

def component_failures(report: CheckReport) -> list[str]:
    return [c.reason() for c in report.components if not c.ok and not c.buggy]


def crash_failures(report: CheckReport) -> list[str]:
    return [f"{name} crashes: {report.runs[name].error}" for name in report.variants if report.runs[name].error]


def pair_failures(report: CheckReport) -> list[str]:
    return [p.explain() for p in report.pairs if not p.ok and p.verdict != CRASHES]


def probe_failures(report: CheckReport) -> list[str]:
    bug_set = set(report.buggy)
    return [f"{p.subject}: {p.detail}" for p in report.probes if not p.passed and p.subject not in bug_set]


def reference_failures(name: str):
    """The failures of a stage of :class:`~harness.checks.pairs.ReferenceResult` s named ``name``."""
    def failures(report: CheckReport) -> list[str]:
        return [r.explain() for r in report.results[name] if not r.ok and not r.buggy]
    return failures


def tie_failures(report: CheckReport) -> list[str]:
    return [f"{t.variant}: tied parameters: {t.detail}" for t in report.ties if not t.passed]


def bug_failures(report: CheckReport) -> list[str]:
    return [f"{b.variant}: faithful-bug variant NOT flagged by any check" for b in report.bugs if not b.flagged]
