"""The whole check: every section on a set of variants (:func:`run_checks`), the report it gives
(:class:`CheckReport`), and the single-variant entry points (:func:`probe_variant`, :func:`bug_reasons`).

Every section works on one :class:`~harness.checks.runs.CheckSession`, made once per call.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..config import ModelConfig
from ..registry import Registry, Variant
from .contract_variant import variant_contract
from .contracts import check_components
from .inputs import describe_exception, fmt_size
from .masks import MaskComponentResult, mask_result
from .mha import compare_attention_with_mha
from .pairs import (CRASHES, EQUIVALENT, IDENTICAL, NOT_COMPARABLE, UNEXPECTED, PairResult, ReferenceResult,
                    compare_runs, layout_relation, max_abs_diff)
from .policy import Tolerance, expected_relation, get_tolerance
from .probes import ProbeResult, run_probes
from .runs import CheckSession, VariantRun, load_variant, run_variant
from .ties import TieResult, check_ties
from .transformer import compare_with_nn_transformer


@dataclass
class BugResult:
    """A faithful-bug variant and the reasons the checks flag it (flagged = at least one reason)."""

    variant: str
    summary: str
    reasons: list[str]

    @property
    def flagged(self) -> bool:
        return bool(self.reasons)


@dataclass
class CheckReport:
    """Everything ``python -m harness check`` measured; :meth:`failures` decides the exit code."""

    variants: list[str]
    buggy: list[str]
    cfg: ModelConfig
    device: str
    dtype: str
    seed: int
    tolerance: Tolerance
    tf32: str
    runs: dict[str, VariantRun]
    pairs: list[PairResult]
    probes: list[ProbeResult]
    masks: list[MaskComponentResult]
    mha: list[ReferenceResult]
    transformer: list[ReferenceResult]
    ties: list[TieResult]
    devices: list[ReferenceResult]
    bugs: list[BugResult]
    wall_s: float = 0.0
    components: list = field(default_factory=list)  # harness.checks.contracts.ComponentResult

    def failures(self) -> list[str]:
        """One line per result that does not match its declaration (empty: exit 0). Components that
        break their slot's contract come first: they name the fault."""
        out = [c.reason() for c in self.components if not c.ok and not c.buggy]
        bug_set = set(self.buggy)
        for name in self.variants:
            if self.runs[name].error:
                out.append(f"{name} crashes: {self.runs[name].error}")
        out += [p.explain() for p in self.pairs if not p.ok and p.verdict != CRASHES]
        out += [f"{p.subject}: {p.detail}" for p in self.probes if not p.passed and p.subject not in bug_set]
        out += [r.explain() for r in self.mha + self.transformer + self.devices if not r.ok and not r.buggy]
        out += [f"{t.variant}: tied parameters: {t.detail}" for t in self.ties if not t.passed]
        out += [f"{b.variant}: faithful-bug variant NOT flagged by any check" for b in self.bugs if not b.flagged]
        return out

    @property
    def ok(self) -> bool:
        return not self.failures()

    def classes(self) -> list[list[str]]:
        """Equivalence classes of the (non-buggy) variants: connected by identical/equivalent pairs."""
        return classes_of(self.variants, self.pairs)


def classes_of(names: list[str], pairs: list[PairResult]) -> list[list[str]]:
    """Connected components of ``names`` under the identical/equivalent ``pairs``, largest first."""
    parent = {v: v for v in names}

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for p in pairs:
        if p.verdict in (IDENTICAL, EQUIVALENT):
            parent[find(p.a)] = find(p.b)
    groups: dict[str, list[str]] = {}
    for v in names:
        groups.setdefault(find(v), []).append(v)
    return sorted((sorted(g) for g in groups.values()), key=lambda g: (-len(g), g))


def equivalence_classes(registry: Registry, variants: list[Variant], cfg: ModelConfig | None = None, *,
                        device: torch.device | str = "cpu", dtype: str = "fp32", seed: int = 0) -> list[list[str]]:
    """Only the pair comparisons of :func:`run_checks` (same session, tolerances and verdicts), so
    the same classes as ``run_checks(...).classes()`` without the contracts, probes and PyTorch
    references: what ``run`` records before training (its integrity gate holds each trial to the
    contracts and probes anyway). Buggy variants are left out.

    Raises:
        ConfigError: bad config/dtype/device.  HarnessError: inconsistent canonical layouts.
    """
    s = CheckSession.create(registry, cfg, device=device, dtype=dtype, seed=seed)
    clean = [v for v in variants if not v.buggy]
    with s.tf32_off():
        s.load_state(clean)
        for v in clean:
            s.run(v)
        pairs = _pairs(s, clean)
    return classes_of([v.name for v in clean], pairs)


def run_checks(registry: Registry, variants: list[Variant], cfg: ModelConfig | None = None, *,
               device: torch.device | str = "cpu", dtype: str = "fp32", seed: int = 0, groups=None,
               log: Callable[[str], None] | None = None, all_components: bool = False) -> CheckReport:
    """Run every check on ``variants`` (buggy ones are probed and must be flagged, never paired).

    Scope: the components the variants use (each held to its slot's reference on its own, and every
    attention x mask in use against ``nn.MultiheadAttention``); with ``all_components`` every
    registered component. Nothing outside the scope can change the result. Each variant's probes
    come with its model-level contract (:func:`~harness.checks.contract_variant.variant_contract`:
    logits, gradients, canonical round trip, same seed), in :attr:`CheckReport.probes`. The
    conformance kit (:mod:`harness.testing`) calls this function: the kit and ``check`` cannot disagree.

    Args:
        cfg: model config (default :data:`~harness.checks.inputs.CHECK_MODEL`).
        device: where the comparisons run; the CPU-vs-CUDA comparison runs whenever CUDA exists.
        dtype: ``fp32`` or ``bf16`` (autocast).
        groups: declared-equivalent components (default: the registrations' declarations,
            :func:`~harness.checks.policy.registry_groups`).
        log: optional progress callback (one line per stage).

    Raises:
        ConfigError: bad config/dtype/device.  HarnessError: inconsistent canonical layouts.
    """
    t0 = time.perf_counter()
    log = log or (lambda line: None)
    s = CheckSession.create(registry, cfg, device=device, dtype=dtype, seed=seed, groups=groups)
    s.declared()
    clean = [v for v in variants if not v.buggy]
    buggy = [v for v in variants if v.buggy]
    keys = sorted(registry.components) if all_components else _used_components(variants)
    with s.tf32_off():
        log(f"check: {len(keys)} component(s) against their slot's reference")
        components = check_components(registry, keys, s.cfg, seed)
        s.load_state(variants)
        log(f"check: {len(clean)} variant(s) + {len(buggy)} faithful-bug variant(s) on {s.device.type} {dtype}")
        for v in variants:
            s.run(v)
        pairs = _pairs(s, clean)
        log(f"check: {len(pairs)} pair(s) compared; probes")
        probes = [p for v in variants if not s.runs[v.name].error
                  for p in _probe_model(s, v) + variant_contract(s, v)]
        masks = [mask_result(m, registry.component("mask", m).buggy,
                             [c for c in components if (c.slot, c.name) == ("mask", m)])
                 for (slot, m) in keys if slot == "mask"]  # already measured by the contract check
        log("check: attention vs nn.MultiheadAttention, stacks vs nn.Transformer")
        mha, transformer = _pytorch_references(s, variants, keys)
        log("check: tied embeddings, devices")
        ties = [check_ties(registry, v, s.cfg, s.state, device=s.device, tol=s.tol, seed=seed) for v in clean
                if not s.runs[v.name].error]
        devices = _device_checks(s, clean)
    bugs = [_bug_reasons(v, s, probes, mha, transformer, components) for v in buggy]
    return CheckReport([v.name for v in clean], [v.name for v in buggy], s.cfg, s.device.type, dtype, seed, s.tol,
                       s.tf32, s.runs, pairs, probes, masks, mha, transformer, ties, devices, bugs,
                       time.perf_counter() - t0, components)


def _used_components(variants) -> list[tuple[str, str]]:
    """Every (slot, component) the variants use, sorted."""
    return sorted({(slot, name) for v in variants for slot, name in v.resolved().items()})


def _pairs(s: CheckSession, clean: list[Variant]) -> list[PairResult]:
    """Every pair of the (non-buggy) variants, judged against what their slots declare."""
    pairs = []
    for a, b in itertools.combinations(clean, 2):
        ra, rb = s.runs[a.name], s.runs[b.name]
        rel, declared = layout_relation(ra, rb, *expected_relation(a, b, s.declared()))
        pairs.append(compare_runs(ra, rb, rel, declared, s.tol, s.keep))
    return pairs


def _threshold_for(run: VariantRun, tol: Tolerance, keep) -> float:
    """A variant's own logit threshold: ``max(atol, fudge * ref_error)`` at the ``keep`` positions."""
    if run.logits is None:
        return tol.atol
    ref = max_abs_diff(run.logits[keep].double(), run.logits64[keep].double())
    return tol.threshold(ref)


def _probe_model(s: CheckSession, v: Variant) -> list[ProbeResult]:
    """The probes of :func:`harness.checks.probes.run_probes` on ``v`` holding the session's state."""
    thr = _threshold_for(s.runs[v.name], s.tol, s.keep)
    try:
        model, _ = load_variant(s.registry, v, s.cfg, s.state)
        return run_probes(model.to(s.device), s.batch, s.cfg, thr, device=s.device, dtype=s.dtype, seed=s.seed,
                          name=v.name)
    except Exception as exc:  # noqa: BLE001
        return [ProbeResult(v.name, "probes", "-", False, math.inf, thr, f"crashes: {describe_exception(exc)}")]


def _pytorch_references(s: CheckSession, variants: list[Variant],
                        keys) -> tuple[list[ReferenceResult], list[ReferenceResult]]:
    """(attention components vs ``nn.MultiheadAttention``, stacks vs ``nn.Transformer``)."""
    mha = []
    for att, msk, proj in _attention_combos(variants, keys):
        mha += compare_attention_with_mha(s.registry, att, msk, proj, s.cfg, device=s.device, dtype=s.dtype,
                                          seed=s.seed, groups=s.declared())
    transformer = []
    for v in variants:
        if v.name not in s.build_errors:
            transformer += compare_with_nn_transformer(s.registry, v, s.cfg, s.state, device=s.device, dtype=s.dtype,
                                                       seed=s.seed, groups=s.declared())
    return mha, transformer


def probe_variant(registry: Registry, variant: Variant, cfg: ModelConfig | None = None, *,
                  device: torch.device | str = "cpu", dtype: str = "fp32", seed: int = 0) -> list[ProbeResult]:
    """The model-level probes of :mod:`harness.checks.probes` (finite gradients; causal leak and masked
    source keys in eval and train mode; extra source padding) on ``variant``.

    The threshold is the variant's own: ``max(atol, fudge * ref_error)`` of its logits. A variant that
    crashes gives one failed result whose detail is the crash.
    """
    s = CheckSession.create(registry, cfg, device=device, dtype=dtype, seed=seed)
    with s.tf32_off():
        s.load_state([variant])
        run = s.run(variant)
        if run.error:
            return [ProbeResult(variant.name, "forward/backward", "eval", False, math.inf, s.tol.atol,
                                f"crashes: {run.error}")]
        return _probe_model(s, variant)


def bug_reasons(registry: Registry, variant: Variant, cfg: ModelConfig | None = None, *,
                device: torch.device | str = "cpu", dtype: str = "fp32", seed: int = 0) -> BugResult:
    """Every reason the checks give to flag ``variant``: its components against their slots'
    references, a crash, failed probes, its attention against ``nn.MultiheadAttention`` and its
    stacks against ``nn.Transformer``. Empty reasons: nothing flags it."""
    report = run_checks(registry, [dataclasses.replace(variant, buggy=True)], cfg, device=device, dtype=dtype,
                        seed=seed)
    return report.bugs[0]


def _attention_combos(variants, keys) -> list[tuple[str, str, str]]:
    """Every attention x mask x projections component in ``keys`` (the scope: the components the
    variants use, or all), plus every (attention, mask, projections) a selected variant uses."""
    def names(slot):
        return sorted({n for s, n in keys if s == slot})

    combos = {(a, m, p) for a in names("attention") for m in names("mask") for p in names("projections")}
    combos |= {(r["attention"], r["mask"], r["projections"]) for r in (v.resolved() for v in variants)}
    return sorted(combos)


def _device_checks(s: CheckSession, clean: list[Variant]) -> list[ReferenceResult]:
    """Each variant on the other device (CPU vs CUDA) against its own run; "no CUDA" rows without one."""
    if not torch.cuda.is_available():
        return [ReferenceResult(v.name, "cpu vs cuda", NOT_COMPARABLE, "no CUDA", True,
                                detail="torch.cuda.is_available() is False") for v in clean]
    other = torch.device("cpu") if s.device.type == "cuda" else torch.device("cuda")
    tol = get_tolerance(s.dtype, "cuda")
    out = []
    for v in clean:
        theirs = run_variant(s.registry, v, s.cfg, s.state, s.batch, other, s.dtype)
        res = compare_runs(s.runs[v.name], theirs, "equivalent", [], tol, s.keep)
        out.append(ReferenceResult(v.name, f"{s.device.type} vs {other.type}", "equivalent", res.verdict, res.ok,
                                   res.logits, res.grad_max, res.grad_worst, detail="; ".join(res.notes)))
    return out


def _bug_reasons(v: Variant, s: CheckSession, probes, mha, transformer, components=()) -> BugResult:
    """Why the checks flag the faithful-bug variant ``v``: its broken components, a crash, leaking
    probes, its attention against nn.MultiheadAttention, its stacks against nn.Transformer."""
    reasons = []
    r = v.resolved()
    used = set(r.items())
    reasons += [c.reason() for c in components if not c.ok and (c.slot, c.name) in used]
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
    unique = list(dict.fromkeys(reasons))
    return BugResult(v.name, v.summary, unique)
