"""The check's kinds as registered stages (:class:`CheckStage`) and the report they fill
(:class:`CheckReport`).

A kind of check (the component contracts, the pair comparisons, the probes, the PyTorch
references, ...) is one :class:`CheckStage`: a name, the function that runs it on a
:class:`CheckContext`, the function that lists its results that do not match their declaration
(the ok predicate), and its renderers (``checks.csv`` rows, the ``checks.md`` section). The
registered stages are :data:`harness.checks.stages.STAGES`, run in that order; a new kind is one
more entry there (docs/architecture.md, "Add a check").
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Callable

from ..config import ModelConfig
from ..errors import HarnessError
from .pairs import PairResult
from .policy import Tolerance

if TYPE_CHECKING:
    from ..registry import Registry, Variant
    from .runs import CheckSession


def _nothing(_: Any) -> list:
    return []


@dataclass
class CheckContext:
    """What a stage's ``run`` gets: the session made once per check and the results of the stages
    that ran before it (``ctx.results["pairs"]``).

    Args:
        session: the :class:`~harness.checks.runs.CheckSession` (config, batch, reference state,
            tolerance, the variants' runs).
        registry: the registry the variants come from.
        variants: every variant under check; ``clean`` the ones paired, ``buggy`` the faithful bugs
            (probed, and each must be flagged).
        keys: the ``(slot, component)`` scope: the components the variants use, or all registered.
        seed: seed of the reference parameters and the batch.
        dtype: ``fp32`` or ``bf16``.
    """

    session: CheckSession
    registry: Registry
    variants: list[Variant]
    clean: list[Variant]
    buggy: list[Variant]
    keys: list[tuple[str, str]]
    seed: int
    dtype: str
    results: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckStage:
    """One kind of check, registered once in :data:`harness.checks.stages.STAGES`.

    Args:
        name: where its results go: ``report.results[name]``, also read as ``report.<name>``; a
            Python identifier that is not a :class:`CheckReport` field.
        run: ``run(ctx) -> results`` (a list, or a dict for ``runs``), called in registry order
            with tf32 off; ``ctx.results`` holds the results of the stages before it.
        failures: ``failures(report) -> [line]``: one line per result that does not match its
            declaration (the stage's ok predicate; empty: nothing fails).
        rows: ``rows(report) -> [dict]``: its rows of ``checks.csv``.
        markdown: ``markdown(report) -> [line]``: its section of ``checks.md``.
        log: ``log(ctx) -> str``: the progress line printed before it runs (none when ``None``).
    """

    name: str
    run: Callable[[CheckContext], Any]
    failures: Callable[["CheckReport"], list[str]] = _nothing
    rows: Callable[["CheckReport"], list[dict]] = _nothing
    markdown: Callable[["CheckReport"], list[str]] = _nothing
    log: Callable[[CheckContext], str] | None = None


def stage_registry(*stages: CheckStage) -> tuple[CheckStage, ...]:
    """``stages`` as a registry (a tuple, in run order) once their names are checked.

    Raises:
        HarnessError: a name given twice, not an identifier, or shadowing a :class:`CheckReport` field.
    """
    taken = {f.name for f in fields(CheckReport)} | {"ok", "failures", "classes"}
    seen: set[str] = set()
    for stage in stages:
        if not stage.name.isidentifier() or stage.name in taken or stage.name in seen:
            raise HarnessError(f"check stage name {stage.name!r} is given twice, is not an identifier or is a "
                               f"CheckReport field")
        seen.add(stage.name)
    return tuple(stages)


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
    """Everything ``python -m harness check`` measured; :meth:`failures` decides the exit code.

    Each stage's results are ``results[stage.name]``, read as attributes too (``report.pairs``,
    ``report.probes``, ``report.bugs``, ...): see :data:`harness.checks.stages.STAGES`.
    """

    variants: list[str]
    buggy: list[str]
    cfg: ModelConfig
    device: str
    dtype: str
    seed: int
    tolerance: Tolerance
    tf32: str
    wall_s: float = 0.0
    results: dict[str, Any] = field(default_factory=dict)
    stages: tuple[CheckStage, ...] = ()

    def __getattr__(self, name: str) -> Any:
        results = self.__dict__.get("results")
        if results is not None and name in results:
            return results[name]
        raise AttributeError(f"CheckReport has no field or check stage {name!r}")

    def failures(self) -> list[str]:
        """One line per result that does not match its declaration (empty: exit 0), stage by stage
        in registry order: components that break their slot's contract come first, they name the fault."""
        return [line for stage in self.stages for line in stage.failures(self)]

    @property
    def ok(self) -> bool:
        return not self.failures()

    def classes(self) -> list[list[str]]:
        """Equivalence classes of the (non-buggy) variants: connected by identical/equivalent pairs."""
        return classes_of(self.variants, self.results.get("pairs", []))


def classes_of(names: list[str], pairs: list[PairResult]) -> list[list[str]]:
    """Connected components of ``names`` under the ``pairs`` measured the same function
    (:attr:`~harness.checks.pairs.PairResult.same_function`, whatever they declare), largest first."""
    parent = {v: v for v in names}

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for p in pairs:
        if p.same_function:
            parent[find(p.a)] = find(p.b)
    groups: dict[str, list[str]] = {}
    for v in names:
        groups.setdefault(find(v), []).append(v)
    return sorted((sorted(g) for g in groups.values()), key=lambda g: (-len(g), g))
