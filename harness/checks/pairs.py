"""Comparing: one tensor against another within its threshold, a pair of variants, and the verdicts.

Each compared tensor: max |A - B| against ``threshold = max(atol, fudge * max(ref_error_A, ref_error_B))``
(:class:`harness.checks.policy.Tolerance`), with ``ref_error`` the distance of a run from its own
float64 run and |A64 - B64| reported too (~1e-15: the same function).

Shape letters: B batch, T target length, V vocabulary.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..config import ModelConfig
from ..registry import Registry, Variant
from .inputs import fmt_size
from .expectations import expected_relation
from .policy import Tolerance
from .runs import CheckSession, VariantRun, layout_conflict


@dataclass
class TensorDiff:
    """One compared tensor: max |A - B| against ``max(atol, fudge * ref_error)``.

    ``ref_error`` is max(|A - A64|, |B - B64|); ``golden`` is |A64 - B64| (the difference that
    remains without rounding). Values are in the tensor's unit (logits: nats; gradients: per unit).
    """

    name: str
    max_abs: float
    ref_error: float
    threshold: float
    golden: float
    bitwise: bool

    @property
    def within(self) -> bool:
        return self.max_abs <= self.threshold

    @property
    def ratio(self) -> float:
        return self.max_abs / self.threshold if self.threshold > 0 else math.inf


def max_abs_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """max |x - y| in float64; inf when NaNs sit at different places, NaN-NaN pairs count as equal."""
    if x.shape != y.shape:
        return math.inf
    nx, ny = torch.isnan(x), torch.isnan(y)
    if not torch.equal(nx, ny):
        return math.inf
    d = (x - y).abs().masked_fill(nx, 0.0)
    d = torch.nan_to_num(d, nan=math.inf)  # inf - inf
    return float(d.max()) if d.numel() else 0.0


def tensor_diff(name: str, a, b, a64, b64, tol: Tolerance, keep: torch.Tensor | None = None) -> TensorDiff:
    """Compare ``a`` with ``b`` (optionally only where ``keep`` (leading dims) is True)."""
    ts = [t.detach().cpu() for t in (a, b, a64, b64)]
    if keep is not None:
        k = keep.cpu()
        ts = [t[k] for t in ts]
    bitwise = ts[0].dtype == ts[1].dtype and torch.equal(ts[0], ts[1])
    a, b, a64, b64 = (t.to(torch.float64) for t in ts)
    ref = max(max_abs_diff(a, a64), max_abs_diff(b, b64))
    scale = max((float(t.abs().max()) for t in (a64, b64) if t.numel() and torch.isfinite(t).all()), default=None)
    return TensorDiff(name, 0.0 if bitwise else max_abs_diff(a, b), ref, tol.threshold(ref, scale), max_abs_diff(a64, b64),
                      bitwise)


def kink_note(d: TensorDiff, against: str) -> str:
    """Why a first draw's gradient gap ``d`` (the outputs within theirs) was set aside when a second reference state
    and batch (seed + 1) found none: a ReLU input within float32 rounding of 0 takes the other side in one run and
    moves one gradient entry far beyond rounding, on that draw only (docs/checks.md, nn.Transformer). ``against``:
    what the gradient was compared with."""
    return (f"on the first reference state and batch {d.name}'s gradient was {d.max_abs:.3g} from {against} "
            f"(threshold {d.threshold:.3g}) with the outputs within theirs, and not on a second draw (seed + 1): "
            f"a rounding event at a kink (a ReLU input within rounding of 0 takes the other side in float32), "
            f"not a difference of function")


IDENTICAL = "identical"
EQUIVALENT = "equivalent"
DECLARED = "differs as declared"
UNEXPECTED = "differs unexpectedly"
UNEXPECTED_SAME = "no difference (declared different)"
CRASHES = "crashes"
NOT_COMPARABLE = "not comparable"


def verdict_for(diffs: list[TensorDiff], expected: str) -> tuple[str, bool]:
    """(verdict, ok) from the compared tensors and what the declarations expect (``equivalent``/``differs``)."""
    within = all(d.within for d in diffs)
    if expected == "equivalent":
        if within:
            return (IDENTICAL if all(d.bitwise for d in diffs) else EQUIVALENT), True
        return UNEXPECTED, False
    return (UNEXPECTED_SAME, True) if within else (DECLARED, True)


@dataclass
class PairResult:
    """A vs B: what the slots declare, what was measured, the verdict."""

    a: str
    b: str
    expected: str
    declared: list[str]
    verdict: str
    ok: bool
    logits: TensorDiff | None = None
    grad_max: TensorDiff | None = None      # the gradient with the largest max |Δ|
    grad_worst: TensorDiff | None = None    # the gradient closest to (or furthest over) its threshold
    grads_compared: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def diffs(self) -> list[TensorDiff]:
        return [d for d in (self.logits, self.grad_max, self.grad_worst) if d is not None]

    @property
    def binding(self) -> TensorDiff | None:
        """The compared tensor with the largest max|Δ| / threshold."""
        return max(self.diffs, key=lambda d: d.ratio, default=None)

    @property
    def same_function(self) -> bool:
        """Measured the same function: logits and every shared canonical gradient within their thresholds
        (through the canonical views), whatever the two declare. A declared difference measured the same
        (``no difference (declared different)``) is a note, not a failure, and joins the class too."""
        return self.verdict in (IDENTICAL, EQUIVALENT, UNEXPECTED_SAME) and self.logits is not None

    def cell(self) -> str:
        """Short text for the equivalence matrix ("FAIL" only for a pair that fails the check)."""
        size = max((d.max_abs for d in self.diffs), default=None)
        return {IDENTICAL: "identical", EQUIVALENT: f"≈ {fmt_size(size)}",
                DECLARED: f"≠ {fmt_size(self.logits.max_abs if self.logits else None)}",
                UNEXPECTED: f"FAIL ≠ {fmt_size(size)}", UNEXPECTED_SAME: f"≈ {fmt_size(size)} (declared ≠)",
                CRASHES: "FAIL crash", NOT_COMPARABLE: "no counterpart"}.get(self.verdict, self.verdict)

    def symbol(self) -> str:
        """:meth:`cell` in a symbol, for the matrix on a narrow terminal: ``=``, ``≈``, ``≠x`` (x the
        max |Δ logit| to 2 significant digits), ``≈!`` (declared different, measured the same),
        ``FAIL`` or ``n/a``."""
        if self.verdict == DECLARED:
            return f"≠{self.logits.max_abs:.2g}" if self.logits else "≠"
        return {IDENTICAL: "=", EQUIVALENT: "≈", UNEXPECTED_SAME: "≈!", UNEXPECTED: "FAIL", CRASHES: "FAIL",
                NOT_COMPARABLE: "n/a"}.get(self.verdict, self.verdict)

    def explain(self) -> str:
        """One paragraph a reader understands (used in assertion messages)."""
        parts = [f"{self.a} vs {self.b}: {self.verdict} (expected {self.expected}"
                 + (f": {'; '.join(self.declared)}" if self.declared else "") + ")"]
        if self.logits:
            parts.append(f"max|Δ logits| {fmt_size(self.logits.max_abs)} (threshold {fmt_size(self.logits.threshold)}, "
                         f"float64 runs differ by {fmt_size(self.logits.golden)})")
        if self.grad_max:
            parts.append(f"max|Δ grad| {fmt_size(self.grad_max.max_abs)} in {self.grad_max.name} "
                         f"(threshold {fmt_size(self.grad_max.threshold)})")
        if self.grad_worst and self.grad_worst is not self.grad_max and not self.grad_worst.within:
            parts.append(f"over threshold: {self.grad_worst.name} {fmt_size(self.grad_worst.max_abs)} > "
                         f"{fmt_size(self.grad_worst.threshold)}")
        parts += self.notes
        return "; ".join(parts)


def layout_relation(ra: "VariantRun", rb: "VariantRun", expected: str, declared: list[str]) -> tuple[str, list[str]]:
    """A pair declared equivalent by its slots whose variants cannot hold the same parameters (a lossy
    load of the reference state, or canonical parameters only one of them has: a tied embedding, a
    bias-free projection) is a declared difference of parameter layout."""
    if expected != "equivalent" or ra.error or rb.error:
        return expected, declared
    layout = [f"{r.variant}: {n}" for r in (ra, rb) for n in r.notes[:2]]
    only = sorted(set(ra.grads) ^ set(rb.grads))
    if only:
        layout.append(f"canonical parameters in one variant only ({', '.join(only[:2])}{', ...' if len(only) > 2 else ''})")
    if not layout:
        return expected, declared
    return "differs", declared + ["parameter layout: " + "; ".join(layout)]


def not_comparable(a: str, b: str, expected: str, declared: list[str], reason: str) -> PairResult:
    """A pair whose variants cannot hold one canonical state (:func:`~harness.checks.runs.layout_conflict`):
    never a failure, never one class."""
    return PairResult(a, b, expected, declared, NOT_COMPARABLE, True, notes=[reason])


def compare_outputs(ra: VariantRun, rb: VariantRun, expected: str, declared: list[str], tol: Tolerance,
                 keep: torch.Tensor) -> PairResult:
    """Compare two :class:`VariantRun` s: logits at ``keep`` (B, T) positions and every shared canonical gradient."""
    if ra.error or rb.error:
        notes = [f"{r.variant} crashes: {r.error}" for r in (ra, rb) if r.error]
        return PairResult(ra.variant, rb.variant, expected, declared, CRASHES, False, notes=notes)
    logits = tensor_diff("logits", ra.logits, rb.logits, ra.logits64, rb.logits64, tol, keep)
    common = sorted(set(ra.grads) & set(rb.grads))
    grads = [tensor_diff(n, ra.grads[n], rb.grads[n], ra.grads64[n], rb.grads64[n], tol) for n in common]
    notes = []
    for x, y in ((ra, rb), (rb, ra)):
        only = sorted(set(x.grads) - set(y.grads))
        if only:
            notes.append(f"{len(only)} canonical parameter(s) only in {x.variant} "
                         f"({', '.join(only[:3])}{', ...' if len(only) > 3 else ''})")
    verdict, ok = verdict_for([logits, *grads], expected)
    return PairResult(ra.variant, rb.variant, expected, declared, verdict, ok, logits,
                      max(grads, key=lambda d: d.max_abs, default=None),
                      max(grads, key=lambda d: d.ratio, default=None), len(grads), notes)


def compare_variants(registry: Registry, a: str | Variant, b: str | Variant, cfg: ModelConfig | None = None, *,
                     device: str = "cpu", dtype: str = "fp32", seed: int = 0, groups=None,
                     expected: str | None = None) -> PairResult:
    """Copy A's canonical parameters into B, run both (and their float64 runs) on one padded batch, compare.

    Args:
        expected: ``"equivalent"`` / ``"differs"``; default: :func:`expected_relation` from the slots.

    Raises:
        UnknownNameError: an unknown variant name.  ConfigError: bad ``cfg``, dtype or device.
    """
    session = CheckSession.create(registry, cfg, device=device, dtype=dtype, seed=seed, groups=groups)
    va, vb = (registry.select([x])[0] if isinstance(x, str) else x for x in (a, b))
    rel, declared = expected_relation(va, vb, session.declared())
    with session.tf32_off():
        session.load_state([va, vb])
        ra, rb = session.run(va), session.run(vb)
    conflict = layout_conflict(va.name, vb.name, session.shapes)
    if conflict:
        return not_comparable(va.name, vb.name, expected or rel, declared, conflict)
    if expected is None:
        rel, declared = layout_relation(ra, rb, rel, declared)
    return compare_outputs(ra, rb, expected or rel, declared, session.tol, session.keep)


# --------------------------------------------------------------------------- against a reference

@dataclass
class ReferenceResult:
    """A component or stack against a PyTorch built-in (or against itself on another device)."""

    subject: str
    reference: str
    expected: str
    verdict: str
    ok: bool
    output: TensorDiff | None = None
    grad_max: TensorDiff | None = None
    grad_worst: TensorDiff | None = None
    padded_rows: float | None = None
    detail: str = ""
    buggy: bool = False

    @property
    def diffs(self) -> list[TensorDiff]:
        return [d for d in (self.output, self.grad_max, self.grad_worst) if d is not None]

    @property
    def binding(self) -> TensorDiff | None:
        return max(self.diffs, key=lambda d: d.ratio, default=None)

    def explain(self) -> str:
        parts = [f"{self.subject} vs {self.reference}: {self.verdict} (expected {self.expected})"]
        if self.output:
            parts.append(f"max|Δ output| {fmt_size(self.output.max_abs)} (threshold {fmt_size(self.output.threshold)})")
        if self.grad_max:
            parts.append(f"max|Δ grad| {fmt_size(self.grad_max.max_abs)} in {self.grad_max.name} "
                         f"(threshold {fmt_size(self.grad_max.threshold)})")
        if self.detail:
            parts.append(self.detail)
        return "; ".join(parts)


def reference_verdict(subject, reference, expected, out: TensorDiff, grads: list[TensorDiff], buggy: bool,
                      padded: float | None = None, detail: str = "") -> ReferenceResult:
    """A :class:`ReferenceResult` from the compared output and gradients (largest and binding gradient kept)."""
    verdict, ok = verdict_for([out, *grads], expected)
    return ReferenceResult(subject, reference, expected, verdict, ok, out,
                           max(grads, key=lambda d: d.max_abs, default=None),
                           max(grads, key=lambda d: d.ratio, default=None), padded, detail, buggy)
