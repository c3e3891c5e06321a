"""The common ground of the component contracts: every slot's reference (:data:`SLOT_REFERENCES`),
the verdicts and :class:`ComponentResult`, the harness's reference siblings (a -inf keep-mask,
``nn.LayerNorm``, ``nn.Linear``) and the judgement of a measured gap against a declaration.

See :mod:`harness.checks.contracts` for the whole contract and its sources.

Shape letters: B batch, L length, S source length, T target length, D = d_model.
"""
from __future__ import annotations

import math
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from torch import nn

from ..config import ModelConfig
from ..model import BuildContext, canonical_state_dict, load_canonical_state_dict, parameter_of
from ..registry import Component
from ..slots import BUILTIN
from .formulas import FORMULAS
from .inputs import describe_exception, draw_reference_state, fmt_size
from .policy import COMPONENT_ATOL, COMPONENT_RTOL, LONGEST_ROW

#: slot -> what every component of the slot must compute (unless it declares otherwise), derived from
#: the built-in slots' declarations (:data:`harness.slots.BUILTIN`, ``Slot.reference``).
SLOT_REFERENCES: dict[str, str] = {s.name: s.reference for s in BUILTIN}

#: slot -> component: the siblings for a plugin's slots (their default components; the harness has no
#: reference of its own for them) while a registry with such slots is checked (set by
#: :func:`harness.checks.contracts.check_contracts`), so a component that asks ``ctx.make`` for one is
#: checked on its own like any other.
PLUGIN_SIBLINGS: ContextVar[dict[str, Component]] = ContextVar("plugin_siblings", default={})

# verdicts of a component check
CONFORMS = "conforms"
DECLARED = "differs as declared"
VIOLATES = "violates its slot"
NO_DIFF = "no difference (declared different)"
CRASHES = "crashes"
FLAGGED = "flagged (declared bug)"
NOT_FLAGGED = "NOT flagged (declared bug)"
#: What an undeclared difference's failure line suggests (docs/components.md, ``differs=``).
DECLARE_HINT = 'if it differs on purpose, declare it: Component(..., differs="what and why")'
TAKES_NO_POSITIONS = "takes no positions"  # an attention that never asks ctx.positions (fine unless paired with RoPE/ALiBi)


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
        size = "" if self.max_abs is None else f" (max |Δ| {fmt_size(self.max_abs)}, threshold {fmt_size(self.threshold)})"
        return f"{self.slot}={self.name} [{self.check}]: {what}{size}"


def output_gap(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(max |out - ref|, threshold) in float64; inf when shapes differ or NaN/inf appear."""
    if out.shape != ref.shape:
        return math.inf, COMPONENT_ATOL
    d = (out.double() - ref.double()).abs()
    d = torch.nan_to_num(d, nan=math.inf)
    scale = float(ref.double().abs().max()) if ref.numel() else 0.0
    return (float(d.max()) if d.numel() else 0.0), COMPONENT_ATOL + COMPONENT_RTOL * scale


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


def rows_length(cfg: ModelConfig, short: int) -> int:
    """The positions a per-position contract (attention, feed-forward, layer norm) feeds: ``short``, or
    ``cfg.max_len`` (at most :data:`harness.checks.policy.LONGEST_ROW`) where that is longer: the longest row the
    model is built for, so a component that is right on short rows and not on long ones (a position-wise layer
    that mixes positions after 16, an attention that goes block-local above 16 keys) fails there."""
    return max(short, min(cfg.max_len, LONGEST_ROW))


def first_wrong_position(got: torch.Tensor, want: torch.Tensor, threshold: float) -> str:
    """"right up to position p - 1, wrong from position p on (of L)" for (B, L, D) outputs that agree on the
    positions before p and differ at every position from p on; "" otherwise (wrong from position 0, nowhere, or
    at scattered positions: a fault of some rows, such as a low-variance row, is not a fault of positions)."""
    bad = ((got.double() - want.double()).abs().nan_to_num(nan=math.inf) > threshold).any(dim=-1).any(dim=0)  # (L,)
    first = int(bad.nonzero()[0]) if bad.any() else 0
    return (f"right up to position {first - 1}, wrong from position {first} on (of {got.size(1)})"
            if first > 0 and bool(bad[first:].all()) else "")


def sinusoidal_pe(length: int, d_model: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(...) (Vaswani §3.5); (length, D) float64."""
    pos = torch.arange(length, dtype=torch.float64)[:, None]  # (L, 1)
    div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * -(math.log(10000.0) / d_model))
    pe = torch.zeros(length, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div[: d_model // 2])
    return pe


class _ReferenceFFN(nn.Module):
    """The feed-forward sibling of a component checked on its own: w_2(relu(w_1 x)) (Vaswani §3.3)."""

    def __init__(self, ctx):
        super().__init__()
        self.w_1, self.w_2 = nn.Linear(ctx.cfg.d_model, ctx.cfg.d_ff), nn.Linear(ctx.cfg.d_ff, ctx.cfg.d_model)

    def forward(self, x):
        return self.w_2(torch.relu(self.w_1(x)))


def reference_components(**overrides: Component) -> dict[str, Component]:
    """Sibling components for checking one component on its own: the harness's reference mask,
    ``nn.LayerNorm`` and biased ``nn.Linear``; ``overrides`` puts the component under test in its slot."""
    base = {
        **PLUGIN_SIBLINGS.get(),
        "mask": Component("_reference", "mask", lambda ctx: ReferenceMask()),
        "layer_norm": Component("_reference", "layer_norm", lambda ctx: nn.LayerNorm(ctx.cfg.d_model)),
        "projections": Component("_reference", "projections", lambda ctx: nn.Linear),
        "feed_forward": Component("_reference", "feed_forward", lambda ctx: _ReferenceFFN(ctx)),
    }
    base.update(overrides)
    return base


def sibling_context(cfg: ModelConfig, comps: dict[str, Component]) -> BuildContext:
    """The build context of a component checked on its own among ``comps`` (:func:`reference_components`), built
    as the encoder's layer 0 (``ctx.stack``, ``ctx.layer``)."""
    return BuildContext(cfg, comps, stack="encoder", layer=0)


class OutsideCanonicalLayout(Exception):
    """A component owns parameters that its canonical state does not export."""


def uncovered_parameters(module: nn.Module) -> list[str]:
    """Names of ``module``'s parameters that no canonical name reaches (see :mod:`harness.model`).

    Every parameter must be canonical: the checks set the canonical state to random values, so a
    parameter outside it keeps its initial value during every check -- a gate that starts at 0 can
    hide anything behind it until training moves it."""
    canon = list(canonical_state_dict(module).values())
    covered = {id(t) for t in canon} | {id(parameter_of(t)) for t in canon if isinstance(t, torch.Tensor)}
    covered |= {t.data_ptr() for t in canon if isinstance(t, torch.Tensor)}
    return [n for n, p in module.named_parameters() if id(p) not in covered and p.data_ptr() not in covered]


def load_random_state(module: nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Load random canonical parameters into ``module`` (LayerNorm gains away from 1, see
    :func:`harness.checks.inputs.draw_reference_state`) and return the canonical state as loaded.

    Raises:
        OutsideCanonicalLayout: the module has parameters outside its canonical state.
    """
    hidden = uncovered_parameters(module)
    if hidden:
        raise OutsideCanonicalLayout(
            f"parameter(s) {', '.join(hidden[:3])} are outside the canonical layout: the checks cannot set them, so "
            f"whatever they control (e.g. a gate that starts at 0) is never tested; export them from "
            f"canonical_state() or declare the component's difference")
    names = canonical_state_dict(module)
    load_canonical_state_dict(module, draw_reference_state({k: tuple(v.shape) for k, v in names.items()}, seed))
    return {k: v.detach().clone() for k, v in canonical_state_dict(module).items()}


def crash_result(comp: Component, label: str, exc: BaseException) -> ComponentResult:
    """A component check that raised: a layout violation, or a crash."""
    if isinstance(exc, OutsideCanonicalLayout):
        return component_result(comp, label, VIOLATES, False, diagnosis=str(exc))
    return component_result(comp, label, CRASHES, False, detail=f"crashes: {describe_exception(exc)}")


# --------------------------------------------------------------------------- verdicts

def component_result(comp: Component, check: str, verdict: str, ok: bool, max_abs: float | None = None,
                     threshold: float | None = None, diagnosis: str = "", detail: str = "") -> ComponentResult:
    """A :class:`ComponentResult` for ``comp`` (its slot, name, plugin, declaration and bug flag filled in)."""
    return ComponentResult(comp.slot, comp.name, comp.plugin, comp.declaration(), check, verdict, ok, max_abs,
                           threshold, diagnosis, detail, comp.buggy)


def formula_result(comp: Component, label: str, gap: float, thr: float, diagnosis: str) -> ComponentResult:
    """A component held to its declared formula: conforms, or violates with the fault named."""
    if gap > thr:
        return component_result(comp, label, VIOLATES, False, gap, thr, diagnosis or
                                f"differs from the formula it declares ({FORMULAS[comp.slot][comp.reference]})")
    return component_result(comp, label, CONFORMS, True, gap, thr)


def unknown_formula(comp: Component) -> list[ComponentResult] | None:
    """A failing result when ``comp.reference`` names no formula of its slot (None when it is fine)."""
    if comp.reference and comp.reference not in FORMULAS.get(comp.slot, {}):
        known = ", ".join(FORMULAS.get(comp.slot, {})) or "none"
        return [component_result(comp, f"reference={comp.reference!r}", VIOLATES, False, diagnosis=(
            f"declares reference={comp.reference!r}, which is no formula of the {comp.slot} slot (known: {known})"))]
    return None


def judge(comp: Component, check: str, gap: float, thr: float, diagnosis: str = "") -> ComponentResult:
    """Verdict from the measured gap and the component's declaration."""
    differs = gap > thr
    if comp.differs or comp.equivalent_to:
        # declared: report the size; held to another component: judged by the pair checks
        verdict = DECLARED if differs else NO_DIFF
        note = ("" if differs else "declared different but matches the slot's reference within tolerance "
                "(drop differs= from its registration)") if comp.differs else f"held to {comp.equivalent_to}"
        return component_result(comp, check, verdict, True, gap, thr, diagnosis, note)
    if differs:
        return component_result(comp, check, VIOLATES, False, gap, thr, diagnosis or
                                f"differs from the slot's reference ({SLOT_REFERENCES.get(comp.slot, comp.slot).split(':')[0]}) "
                                f"({DECLARE_HINT})")
    return component_result(comp, check, CONFORMS, True, gap, thr)

