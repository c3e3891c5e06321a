"""What each pair of variants is expected to show.

Two components of a slot compute the same function when the registrations say so
(:func:`harness.checks.contracts.declared_groups`: components that declare nothing are held to their
slot's reference and so to each other); ``--equivalent SLOT=A,B`` adds groups. The core names no
component: every group comes from the registry or the command line. The tolerances a measured pair is held to
are in :mod:`harness.checks.policy`.
"""
from __future__ import annotations

from typing import Iterable

from ..config import ModelConfig
from ..errors import ConfigError
from ..registry import SLOT_DOCS, Registry, Variant
from .contracts import declared_groups, reference_key


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

