"""Check policy: the one tolerance table, and what each pair of variants is expected to show.

Tolerances: ``threshold = max(atol, fudge * ref_error)`` (PyTorch ``test_transformers``'
``check_out_and_grad``), keyed by (dtype, device type) in :data:`TOLERANCES`.

Expectations: two components of a slot compute the same function when the registrations say so
(:func:`harness.checks.contracts.declared_groups`: components that declare nothing are held to their
slot's reference and so to each other); ``--equivalent SLOT=A,B`` adds groups. The core names no
component: every group comes from the registry or the command line.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from ..config import ModelConfig
from ..errors import ConfigError
from ..registry import SLOT_DOCS, Registry, Variant
from .contracts import declared_groups, reference_key


@dataclass(frozen=True)
class Tolerance:
    """How close two runs must be to count as the same function.

    Args:
        atol: absolute floor of the threshold (same unit as the compared tensor).
        fudge: multiplier on the reference error (error of a run against its own float64 run).
        note: where the numbers come from / the policy they assume.
    """

    atol: float
    fudge: float
    note: str = ""

    ref_cap: float = math.inf

    def threshold(self, ref_error: float, scale: float | None = None) -> float:
        """``max(atol, fudge * ref_error)`` (PyTorch ``check_out_and_grad``); ``atol`` if ``ref_error`` is
        not finite. With ``scale`` (max |float64 value| of the compared tensor) ``ref_error`` is first
        capped at ``max(ref_cap * scale, 100 * atol)``: a run whose error against its own float64 run is far beyond
        rounding (a component that is right only in float64) must not widen its own threshold by it."""
        if not math.isfinite(ref_error):
            return self.atol
        if scale is not None and math.isfinite(scale):
            ref_error = min(ref_error, max(self.ref_cap * scale, 100 * self.atol))
        return max(self.atol, self.fudge * ref_error)


#: The one tolerance table, keyed by (dtype, device type). fp32 on CUDA assumes TF32 is off (the
#: checks switch it off and record the policy); bf16 means ``torch.autocast(bfloat16)``.
TOLERANCES: dict[tuple[str, str], Tolerance] = {
    ("fp32", "cpu"): Tolerance(1e-5, 5.0, "torch.testing default atol for float32; fudge 5 as in PyTorch "
                              "test_transformers; reference error capped at 1e-3 x max|value|", 1e-3),
    ("fp32", "cuda"): Tolerance(1e-5, 5.0, "as fp32/cpu; TF32 switched off for matmul and cuDNN during the checks",
                                1e-3),
    ("bf16", "cpu"): Tolerance(1e-3, 5.0, "torch.autocast(bfloat16); PyTorch default_atol[bfloat16]; reference "
                              "error capped at 0.1 x max|value|", 0.1),
    ("bf16", "cuda"): Tolerance(1e-3, 5.0, "torch.autocast(bfloat16); PyTorch default_atol[bfloat16]", 0.1),
}


def get_tolerance(dtype: str, device: str) -> Tolerance:
    """The :data:`TOLERANCES` entry for ``dtype`` (fp32, bf16) on ``device`` (cpu, cuda, cuda:N).

    Raises:
        ConfigError: no entry for that pair.
    """
    key = (dtype, device.split(":")[0])
    if key not in TOLERANCES:
        known = ", ".join(f"{d}/{dev}" for d, dev in TOLERANCES)
        raise ConfigError(f"no check tolerance for dtype {dtype!r} on {device!r}; known: {known}")
    return TOLERANCES[key]


# --------------------------------------------------------------------------- expectations

def slot_default(slot: str) -> str:
    """The component a variant gets in ``slot`` when it names none (the registry's default).

    Raises:
        KeyError: no such slot.
    """
    return Variant("_default", {}).resolved()[slot]


def registry_groups(registry: Registry, extra: dict[str, Iterable[Iterable[str]]] | None = None,
                    cfg: ModelConfig | None = None) -> dict[str, tuple[frozenset[str], ...]]:
    """The components' declared equivalence groups (:func:`harness.checks.contracts.declared_groups`) plus
    ``extra`` (e.g. from ``--equivalent``)."""
    return merge_groups(extra, declared_groups(registry, cfg), registry.slots)


def held_to_reference(registry: Registry, slot: str, name: str, groups) -> bool:
    """Whether component ``name`` is expected to compute its slot's reference: it declares nothing
    (or is ``equivalent_to`` such a component), or ``groups`` put it with one that does."""
    if reference_key(registry, slot, name).startswith("reference"):
        return True
    return any(same_function(slot, name, other, groups) and reference_key(registry, slot, other) == "reference"
               for (s, other) in registry.components if s == slot and other != name)


def merge_groups(extra: dict[str, Iterable[Iterable[str]]] | None,
                 base: dict[str, tuple[frozenset[str], ...]] | None = None,
                 slots: Iterable[str] = tuple(SLOT_DOCS)) -> dict[str, tuple[frozenset[str], ...]]:
    """``base`` (default: no groups) plus ``extra`` groups; groups sharing a component are merged.
    Raises ConfigError on a slot not among ``slots`` (default: the built-in slots; a registry's own,
    plugins' included, through :func:`registry_groups`)."""
    slots = list(slots)
    out = {slot: [set(g) for g in groups] for slot, groups in (base or {}).items()}
    for slot, groups in (extra or {}).items():
        if slot not in slots:
            raise ConfigError(f"--equivalent: unknown slot {slot!r}; slots: {', '.join(slots)}")
        for g in groups:
            new = set(g)
            keep = []
            for old in out.get(slot, []):
                if old & new:
                    new |= old
                else:
                    keep.append(old)
            out[slot] = keep + [new]
    return {slot: tuple(frozenset(g) for g in groups) for slot, groups in out.items()}


def parse_equivalent(items: Iterable[str]) -> dict[str, list[set[str]]]:
    """``["attention=theirs,my_attn"]`` -> ``{"attention": [{"theirs", "my_attn"}]}``.

    Raises:
        ConfigError: an item that is not ``SLOT=A,B[,...]`` with at least two components.
    """
    out: dict[str, list[set[str]]] = {}
    for item in items:
        slot, sep, comps = item.partition("=")
        names = {c.strip() for c in comps.split(",") if c.strip()}
        if not sep or len(names) < 2:
            raise ConfigError(f"--equivalent expects SLOT=A,B (e.g. attention={slot_default('attention')},my_attn), "
                              f"got {item!r}")
        out.setdefault(slot.strip(), []).append(names)
    return out


def same_function(slot: str, x: str, y: str, groups=None) -> bool:
    """True when components ``x`` and ``y`` of ``slot`` are equal or declared equivalent."""
    return x == y or any(x in g and y in g for g in (groups or {}).get(slot, ()))


def expected_relation(a: Variant, b: Variant, groups=None) -> tuple[str, list[str]]:
    """What a pair should show, from the slots alone.

    Returns:
        ``("equivalent", [])`` when every slot holds the same or a declared-equivalent component,
        else ``("differs", ["norm: post vs pre", ...])`` listing the slots that differ.
    """
    ra, rb = a.resolved(), b.resolved()
    diffs = [f"{slot}: {ra.get(slot)} vs {rb.get(slot)}" for slot in dict.fromkeys([*ra, *rb])  # a plugin's slots too
             if not same_function(slot, ra.get(slot), rb.get(slot), groups)]
    return ("differs" if diffs else "equivalent"), diffs

