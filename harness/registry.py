"""Components, variants and the registry that collects them from plugins.

Vocabulary (see the README): a *slot* is one axis of choice, a *component* one
implementation for one slot, a *variant* a named assignment of components to slots.
"""
from __future__ import annotations

import copy
import dataclasses
import fnmatch
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from .errors import DuplicateNameError, HarnessError, PluginError, UnknownNameError
from .tasks.base import Task

#: slot -> (default component, what the slot decides). Every variant gets a component for
#: every slot; a slot a variant leaves out takes the default, which is the paper's choice.
SLOTS: dict[str, tuple[str, str]] = {
    "norm": ("post", "where LayerNorm sits around each sub-layer (post-norm / pre-norm)"),
    "embedding": ("separate", "source/target embeddings and generator: separate or one shared matrix"),
    "attention": ("annotated", "how multi-head attention is written (heads split, matmul vs bmm, SDPA)"),
    "mask": ("bool", "how masks are made and applied to attention scores (bool keep-mask / additive)"),
    "layer_norm": ("torch", "the LayerNorm formula (nn.LayerNorm / the notes' unbiased std + eps)"),
    "positional": ("scaled", "embedding scale and positional encoding (x*sqrt(d_model)+PE / +PE then LayerNorm)"),
    "projections": ("biased", "whether attention and FFN projections carry a bias"),
}
#: The slots the built-in single-change variants and ``--grid`` vary.
MAIN_SLOTS = ("norm", "embedding", "attention", "mask")


@dataclass(frozen=True)
class Component:
    """One implementation for one slot.

    Args:
        name: component name, unique within its slot (e.g. ``"pre"``).
        slot: one of :data:`SLOTS`.
        factory: ``factory(ctx: harness.model.BuildContext)`` returning what the slot's
            protocol asks for (documented per slot in ``harness/model.py``).
        summary: one line for ``list`` and reports.
        source: where it comes from (paper section, seed note, d2l section).
        buggy: a faithful reproduction of a bug from a note; never chosen by default. The checks
            must flag it; ``run`` marks its trials ``invalid`` like any leaking variant.
        differs: a declared, deliberate difference from the slot's reference (what and why, with
            the source), e.g. ``"RMSNorm: no mean subtraction, no bias (Zhang & Sennrich 2019)"``.
            Empty (the default): the component is held to the reference of its slot
            (:data:`harness.contracts.SLOT_REFERENCES`) and a measured difference fails ``check``.
            With a declaration ``check`` reports the size of the difference instead.
        equivalent_to: the name of another component of the same slot that this one claims to
            compute the same function as (e.g. a faster rewrite of a component that itself
            declares ``differs``). Held to that component instead of the slot's reference.
        fully_masked_row: mask slot only: what the softmax of a row whose every key is blocked
            gives (a source made only of padding). One of :data:`FULLY_MASKED_ROW`:
            ``"finite"`` (default: any finite distribution), ``"uniform"``, ``"zeros"`` or
            ``"nan"`` (declared: softmax of an all -inf row). Rows of a real batch must be
            finite whatever is declared here.

    Raises (when registered):
        UnknownNameError: unknown slot, or ``equivalent_to`` naming no component of the slot.
        PluginError: ``fully_masked_row`` not in :data:`FULLY_MASKED_ROW`, or both ``differs``
            and ``equivalent_to`` given.
    """

    name: str
    slot: str
    factory: Callable[..., Any]
    summary: str = ""
    source: str = ""
    buggy: bool = False
    differs: str = ""
    equivalent_to: str = ""
    fully_masked_row: str = "finite"
    plugin: str = field(default="", compare=False)

    def declaration(self) -> str:
        """One line: what this component is held to (for ``list`` and reports)."""
        if self.buggy:
            return "deliberate bug (must be flagged)"
        if self.differs:
            return f"differs: {self.differs}"
        if self.equivalent_to:
            return f"equivalent to {self.slot}={self.equivalent_to}"
        return "slot reference"


#: Allowed values of ``Component.fully_masked_row``.
FULLY_MASKED_ROW = ("finite", "uniform", "zeros", "nan")


@dataclass(frozen=True)
class Variant:
    """A named assignment of components to slots.

    Args:
        name: unique variant name (``baseline``, ``pre_norm``, ``seed_001`` ...).
        slots: slot -> component name; missing slots take :data:`SLOTS` defaults.
        summary: one line: what it changes (and, for seed presets, what was fixed).
        source: paper section or seed note.
        buggy: reproduces a bug on purpose; excluded from ``all`` and globs, selectable by name.
    """

    name: str
    slots: dict = field(default_factory=dict)
    summary: str = ""
    source: str = ""
    buggy: bool = False
    plugin: str = field(default="", compare=False)

    def resolved(self) -> dict[str, str]:
        """slot -> component for every slot, defaults filled in."""
        return {slot: self.slots.get(slot, default) for slot, (default, _) in SLOTS.items()}


def _call_hook(pm, hookname: str, kind: type, strict: bool, warnings: list[str]) -> list[tuple[Any, str]]:
    out = []
    for impl in getattr(pm.hook, hookname).get_hookimpls():
        try:
            items = impl.function()
        except Exception as exc:  # noqa: BLE001 - attributed to the plugin
            msg = f"plugin {impl.plugin_name!r}: {hookname}() raised {type(exc).__name__}: {exc}"
            if strict:
                raise PluginError(msg) from exc
            warnings.append(msg)
            continue
        if not isinstance(items, (list, tuple)) or not all(isinstance(i, kind) for i in items):
            got = type(items).__name__ if not isinstance(items, (list, tuple)) else \
                ", ".join(sorted({type(i).__name__ for i in items}))
            msg = f"plugin {impl.plugin_name!r}: {hookname}() must return a list of {kind.__name__}, got {got}"
            if strict:
                raise PluginError(msg)
            warnings.append(msg)
            continue
        out.extend((item, impl.plugin_name) for item in items)
    return out


class Registry:
    """All components, variants and tasks offered by the loaded plugins.

    Build with :meth:`from_plugins`; components are keyed by ``(slot, name)``, variants and
    tasks by name.
    """

    def __init__(self, components: Iterable[Component] = (), variants: Iterable[Variant] = (),
                 warnings: list[str] | None = None, tasks: Iterable[Task] = ()):
        self.components: dict[tuple[str, str], Component] = {}
        self.variants: dict[str, Variant] = {}
        self.tasks: dict[str, Task] = {}
        self.warnings = warnings if warnings is not None else []
        for c in components:
            self.add_component(c)
        for v in variants:
            self.add_variant(v)
        for t in tasks:
            self.add_task(t)

    @classmethod
    def from_plugins(cls, spec=None) -> "Registry":
        """Load built-ins and plugins (see :mod:`harness.plugins`) and collect their hooks.

        Raises:
            PluginError, DuplicateNameError: broken plugin (strict) or duplicate names.
            HarnessError: a variant naming a slot or component that nobody offers.
        """
        from .plugins import PluginSpec, get_plugin_manager

        spec = spec or PluginSpec()
        warnings: list[str] = []
        pm = get_plugin_manager(spec, warnings)
        reg = cls(warnings=warnings)
        comps = _call_hook(pm, "harness_add_components", Component, spec.strict, warnings)
        for comp, plugin in sorted(comps, key=lambda cp: (cp[0].slot, cp[0].name)):
            reg.add_component(dataclasses.replace(comp, plugin=plugin))
        vars_ = _call_hook(pm, "harness_add_variants", Variant, spec.strict, warnings)
        for var, plugin in sorted(vars_, key=lambda vp: vp[0].name):
            reg.add_variant(Variant(var.name, dict(var.slots), var.summary, var.source, var.buggy, plugin))
        tasks = _call_hook(pm, "harness_add_tasks", Task, spec.strict, warnings)
        for task, plugin in sorted(tasks, key=lambda tp: str(tp[0].name)):
            task = copy.copy(task)
            task.plugin = plugin
            reg.add_task(task)
        for comp in reg.components.values():
            reg.validate_component(comp)
        for var in reg.variants.values():
            reg.validate_variant(var)
        return reg

    def validate_component(self, comp: Component) -> None:
        """Check a component's declarations against the registry (see :class:`Component`)."""
        where = f"component {comp.slot}={comp.name} from plugin {comp.plugin!r}"
        if comp.fully_masked_row not in FULLY_MASKED_ROW:
            raise PluginError(f"{where}: fully_masked_row={comp.fully_masked_row!r}; allowed: "
                              f"{', '.join(FULLY_MASKED_ROW)}")
        if comp.differs and comp.equivalent_to:
            raise PluginError(f"{where}: declares both differs= and equivalent_to=; give one")
        if comp.equivalent_to:
            if comp.equivalent_to == comp.name or (comp.slot, comp.equivalent_to) not in self.components:
                raise UnknownNameError(f"{comp.slot} component", comp.equivalent_to,
                                       [n for (s, n) in self.components if s == comp.slot and n != comp.name],
                                       f"equivalent_to= of {where}")

    def add_component(self, comp: Component) -> None:
        if comp.slot not in SLOTS:
            raise UnknownNameError("slot", comp.slot, SLOTS, f"component {comp.name!r} from plugin {comp.plugin!r}")
        key = (comp.slot, comp.name)
        if key in self.components:
            other = self.components[key]
            raise DuplicateNameError(
                f"component {comp.slot}={comp.name} is offered by two plugins: {other.plugin!r} and {comp.plugin!r}")
        self.components[key] = comp

    def add_variant(self, var: Variant) -> None:
        if var.name in self.variants:
            other = self.variants[var.name]
            raise DuplicateNameError(
                f"variant {var.name!r} is offered by two plugins: {other.plugin!r} and {var.plugin!r}")
        self.variants[var.name] = var

    def add_task(self, task: Task) -> None:
        if not isinstance(task.name, str) or not task.name.strip():
            raise PluginError(f"plugin {task.plugin!r}: task {type(task).__name__} has no name "
                              f"(set the class attribute name = '...')")
        if task.name in self.tasks:
            other = self.tasks[task.name]
            raise DuplicateNameError(
                f"task {task.name!r} is offered by two plugins: {other.plugin!r} and {task.plugin!r}")
        self.tasks[task.name] = task

    def task(self, name: str) -> Task:
        """The task called ``name``. Raises UnknownNameError (with close matches)."""
        if name not in self.tasks:
            raise UnknownNameError("task", name, self.tasks, "see: python -m harness list")
        return self.tasks[name]

    def validate_variant(self, var: Variant) -> None:
        for slot, comp in var.slots.items():
            if slot not in SLOTS:
                raise UnknownNameError("slot", slot, SLOTS, f"in variant {var.name!r} from plugin {var.plugin!r}")
            if (slot, comp) not in self.components:
                raise UnknownNameError(f"{slot} component", comp, self.slot_components(slot, True),
                                       f"in variant {var.name!r} from plugin {var.plugin!r}")

    def slot_components(self, slot: str, include_buggy: bool = False) -> list[str]:
        return [n for (s, n), c in self.components.items() if s == slot and (include_buggy or not c.buggy)]

    def component(self, slot: str, name: str) -> Component:
        if slot not in SLOTS:
            raise UnknownNameError("slot", slot, SLOTS)
        if (slot, name) not in self.components:
            raise UnknownNameError(f"{slot} component", name, self.slot_components(slot, True))
        return self.components[(slot, name)]

    def grid(self) -> list[Variant]:
        """The full factorial over :data:`MAIN_SLOTS` (non-buggy components), named
        ``grid-<norm>-<embedding>-<attention>-<mask>``; other slots at their defaults."""
        choices = [sorted(self.slot_components(s)) for s in MAIN_SLOTS]
        out = []
        for combo in itertools.product(*choices):
            name = "grid-" + "-".join(combo)
            out.append(Variant(name, dict(zip(MAIN_SLOTS, combo)),
                               summary=", ".join(f"{s}={c}" for s, c in zip(MAIN_SLOTS, combo)),
                               source="full factorial (--grid)", plugin="harness.registry"))
        return out

    def select(self, patterns: Iterable[str] | str) -> list[Variant]:
        """Resolve ``all``, exact names and shell-style globs to variants, in name order.

        ``all`` and globs skip buggy variants unless the glob itself starts with ``bug``;
        buggy variants are selected by exact name.

        Raises:
            UnknownNameError: a name or glob that matches no variant (with close matches).
        """
        if isinstance(patterns, str):
            patterns = [p for p in patterns.split(",") if p.strip()]
        chosen: dict[str, Variant] = {}
        for pat in patterns:
            pat = pat.strip()
            if pat == "all":
                hits = [v for v in self.variants.values() if not v.buggy]
            elif pat in self.variants:
                hits = [self.variants[pat]]
            elif any(ch in pat for ch in "*?["):
                hits = [v for n, v in self.variants.items() if fnmatch.fnmatchcase(n, pat)
                        and (not v.buggy or pat.startswith("bug"))]
                if not hits:
                    raise UnknownNameError("variant pattern", pat, self.variants, "no variant matches it")
            else:
                raise UnknownNameError("variant", pat, self.variants, "see: python -m harness list")
            for v in hits:
                chosen[v.name] = v
        if not chosen:
            raise HarnessError("no variants selected (use --variants all, names or globs)")
        return [chosen[n] for n in sorted(chosen)]
