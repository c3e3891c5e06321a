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
from typing import TYPE_CHECKING, Any, Callable, Iterable

from .errors import DuplicateNameError, HarnessError, PluginError, UnknownNameError
from .plugins import PluginSpec, builtin_plugin_manager, get_plugin_manager, hook_label
from .slots import BUILTIN, Slot, main_slots

if TYPE_CHECKING:
    from .tasks.base import Task

#: slot -> what the slot decides, for the built-in slots (derived from :data:`harness.slots.BUILTIN`; a
#: registry's own slots, plugins' included, are :attr:`Registry.slots`). Every variant gets a component for
#: every slot; a slot a variant leaves out takes the slot's default component, the one that declares
#: ``Component(..., default=True)`` (for the built-ins: the paper's choice).
SLOT_DOCS: dict[str, str] = {s.name: s.decides for s in BUILTIN}


@dataclass(frozen=True)
class Component:
    """One implementation for one slot.

    Args:
        name: component name, unique within its slot (e.g. ``"pre"``).
        slot: the name of a :class:`harness.slots.Slot` (a built-in one of :data:`SLOT_DOCS`, or one a
            plugin declares with ``harness_add_slots``).
        factory: ``factory(ctx: harness.BuildContext)`` returning what the slot's protocol asks
            for (``Slot.protocol``; the built-in slots' protocols are in :mod:`harness.slots`).
        summary: one line for ``list`` and reports.
        source: where it comes from (paper section, study note, d2l section).
        default: the slot's default component, taken by every variant that leaves the slot out.
            Exactly one component per slot declares it (the built-ins in ``variants/`` do, for
            the paper's choice); none or two is an error naming the plugins.
        buggy: a faithful reproduction of a bug from a note; never chosen by default. The checks
            must flag it; ``run`` marks its trials ``invalid`` like any leaking variant.
        differs: a declared, deliberate difference from the slot's reference (what and why, with
            the source), e.g. ``"RMSNorm: no mean subtraction, no bias (Zhang & Sennrich 2019)"``.
            Empty (the default): the component is held to the reference of its slot
            (:data:`harness.checks.contract_base.SLOT_REFERENCES`) and a measured difference fails ``check``.
            With a declaration ``check`` reports the size of the difference instead.
        equivalent_to: the name of another component of the same slot that this one claims to
            compute the same function as (e.g. a faster rewrite of a component that itself
            declares ``differs``). Held to that component instead of the slot's reference.
        fully_masked_row: mask slot only: what the softmax of a row whose every key is blocked
            gives (a source made only of padding). One of :data:`FULLY_MASKED_ROW`:
            ``"finite"`` (default: any finite distribution), ``"uniform"``, ``"zeros"`` or
            ``"nan"`` (declared: softmax of an all -inf row). Rows of a real batch must be
            finite whatever is declared here.
        reference: the name of an independent reference formula in the checks
            (:data:`harness.checks.formulas.FORMULAS`: ``"rotary"``, ``"linear_biases"``,
            ``"learned_absolute"``, ``"unscaled_pe"``, ``"rms_norm"``, ``"ffn_relu"``, ``"ffn_gelu"``,
            ``"ffn_swiglu"``, ``"ffn_geglu"``, ``"parallel_block"``) that a component declaring ``differs=`` is
            held to instead of
            the slot's default reference: ``check`` fails it when it differs from that formula and
            reports the size of its declared difference from the slot's reference as well. A component
            ``equivalent_to=`` one with a ``reference`` is held to the same formula.
        has_layer_norm: norm slot only. ``False`` declares a residual block with no LayerNorm (ReZero's
            ``x + alpha * sublayer(x)``, Bachlechner et al. 2021; an identity residual ``x + sublayer(x)``):
            it owns no ``norm`` child and is held to the no-LayerNorm residual contract
            (``x + a * sublayer(x)``, a gain ``a`` that gradients reach at initialisation) instead of
            post-norm / pre-norm. Such a block computes neither, so it must also declare ``differs=``
            (or ``equivalent_to=`` another such block, or ``buggy``).

    Raises (when registered):
        UnknownNameError: unknown slot, or ``equivalent_to`` naming no component of the slot.
        PluginError: ``fully_masked_row`` not in :data:`FULLY_MASKED_ROW`, both ``differs``
            and ``equivalent_to`` given, ``default`` on a ``buggy`` component, a slot with no
            or two defaults, or ``has_layer_norm=False`` outside the norm slot or without ``differs=``
            / ``equivalent_to=`` / ``buggy``.
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
    default: bool = False
    has_layer_norm: bool = True
    reference: str = ""
    plugin: str = field(default="", compare=False)

    def declaration(self) -> str:
        """One line: what this component is held to (for ``list`` and reports)."""
        if self.buggy:
            return "deliberate bug (must be flagged)"
        if self.differs:
            return f"differs: {self.differs}" + (f" (held to formula {self.reference!r})" if self.reference else "")
        if self.equivalent_to:
            return f"equivalent to {self.slot}={self.equivalent_to}"
        return "slot reference"

    def held_to(self) -> str:
        """:meth:`declaration` in a few words, for ``list``'s narrow column: ``slot reference``,
        ``formula 'NAME'``, ``differs (declared)``, ``= slot=NAME`` or ``a bug check must flag``."""
        if self.buggy:
            return "a bug check must flag"
        if self.differs:
            return f"formula {self.reference!r}" if self.reference else "differs (declared)"
        if self.equivalent_to:
            return f"= {self.slot}={self.equivalent_to}"
        return "slot reference"


#: Allowed values of ``Component.fully_masked_row``.
FULLY_MASKED_ROW = ("finite", "uniform", "zeros", "nan")


@dataclass(frozen=True)
class Variant:
    """A named assignment of components to slots.

    Args:
        name: unique variant name (``baseline``, ``pre_norm``, ``seed_001`` ...).
        slots: slot -> component name; missing slots take the slot's default component
            (:func:`default_components`).
        summary: one line: what it changes (and, for a study note's variant, what was fixed).
        source: paper section or study note.
        buggy: reproduces a bug on purpose; excluded from ``all`` and globs, selectable by name.
        group: a named group kept out of ``all`` (selected by name, by a glob or as ``group:NAME``),
            e.g. ``"modern"`` for the one-change variants of today's choices (RoPE, SwiGLU, ...), so
            ``run --variants all`` (the main job) does not grow with them.
        compared_with: the variant its verdicts are drawn against in a run that has no ``baseline`` variant and no
            ``--baseline`` (e.g. ``gpt`` for the decoder-only group's variants); used when every variant of the run
            that names one names the same and it is in the run.
    """

    name: str
    slots: dict = field(default_factory=dict)
    summary: str = ""
    source: str = ""
    buggy: bool = False
    plugin: str = field(default="", compare=False)
    group: str = ""
    compared_with: str = field(default="", compare=False)

    def resolved(self, defaults: dict[str, str] | None = None) -> dict[str, str]:
        """slot -> component for every slot, defaults filled in.

        Args:
            defaults: slot -> default component (:attr:`Registry.defaults`); default: the ones
                the built-ins declare (:func:`default_components`).
        """
        defaults = default_components() if defaults is None else defaults
        out = {slot: self.slots.get(slot, comp) for slot, comp in defaults.items()}
        return out | {slot: comp for slot, comp in self.slots.items() if slot not in out}  # a plugin's slot


def declared_defaults(components: Iterable[Component], slots: Iterable[str] = tuple(SLOT_DOCS)) -> dict[str, str]:
    """slot -> the one component of ``components`` declaring ``default=True``, for each of ``slots``
    (default: the built-in slots).

    Raises:
        PluginError: a slot with no default, or with two (naming the components' plugins), or a
            ``buggy`` component declaring it.
    """
    by_slot: dict[str, list[Component]] = {slot: [] for slot in slots}
    for comp in components:
        if comp.default:
            if comp.buggy:
                raise PluginError(f"component {comp.slot}={comp.name} from plugin {comp.plugin!r}: a buggy "
                                  f"component cannot be the slot's default")
            by_slot.setdefault(comp.slot, []).append(comp)
    for slot, comps in by_slot.items():
        if not comps:
            raise PluginError(f"slot {slot!r} has no default component: exactly one component must declare "
                              f"Component(..., default=True) (was the plugin that offers it disabled?)")
        if len(comps) > 1:
            named = " and ".join(f"{c.name} from plugin {c.plugin!r}" for c in comps)
            raise PluginError(f"slot {slot!r} has two default components: {named}; exactly one may declare "
                              f"default=True")
    return {slot: comps[0].name for slot, comps in by_slot.items()}


_BUILTIN_DEFAULTS: dict[str, str] = {}


def default_components() -> dict[str, str]:
    """slot -> default component as the built-in plugins declare it (computed once per process
    from a plugin manager with the built-ins only, through the same hook as every plugin).

    Raises:
        PluginError: as :func:`declared_defaults`.
    """
    if not _BUILTIN_DEFAULTS:
        comps = [c for c, _ in _call_hook(builtin_plugin_manager(), "harness_add_components", Component, True, [])]
        _BUILTIN_DEFAULTS.update(declared_defaults(comps))
    return dict(_BUILTIN_DEFAULTS)


def default_component(slot: str) -> str:
    """The default component of ``slot`` (see :func:`default_components`).

    Raises:
        UnknownNameError: no such slot.
    """
    if slot not in SLOT_DOCS:
        raise UnknownNameError("slot", slot, SLOT_DOCS)
    return default_components()[slot]


def _call_hook(pm, hookname: str, kind: type, strict: bool, warnings: list[str],
               fatal: Iterable[str] = ()) -> list[tuple[Any, str]]:
    """``[(item, plugin name)]`` from ``pm.hook.<hookname>()``, in the plugins' registration order.

    The hook is called once through ``pm.hook`` (pluggy's tracing and hook wrappers apply). When
    that call raises or some plugin returns no list, each plugin is called on its own (a
    ``subset_hook_caller``) to name the one at fault: its error is raised (``strict``) or becomes a
    warning and its items are skipped. A hook wrapper that raises is reported the same way (its
    plugin unnamed) and the results are taken without the wrappers. A plugin that returns something
    other than a list of ``kind`` is named with the file and line of its hook: a
    :class:`PluginError` when ``strict`` or when its name is in ``fatal`` (the plugins named with
    ``-p``/``--plugin``), else a warning and its items are skipped.
    """
    caller = getattr(pm.hook, hookname)
    impls = [i for i in caller.get_hookimpls() if not (i.hookwrapper or i.wrapper)]
    error: Exception | None = None
    try:
        results = caller()
    except Exception as exc:  # noqa: BLE001 - called again plugin by plugin below, to name the plugin
        results, error = None, exc
    if results is not None and len(results) == len(impls):
        per_plugin = list(zip(reversed(results), (i.plugin_name for i in impls)))  # pluggy calls LIFO
    else:
        n_warnings = len(warnings)
        per_plugin = _call_each(pm, hookname, impls, strict, warnings)
        if error is not None and len(warnings) == n_warnings:  # no implementation raised: a hook wrapper did
            msg = f"{hookname}(): a hook wrapper raised {type(error).__name__}: {error} (results taken without it)"
            if strict:
                raise PluginError(msg) from error
            warnings.append(msg)
    functions = {i.plugin_name: i.function for i in impls}
    out = []
    for items, plugin_name in per_plugin:
        got = _wrong_type(items, kind)
        if got is not None:
            msg = (f"plugin {hook_label(plugin_name, functions.get(plugin_name))}: {hookname}() must return "
                   f"a list of {kind.__name__}, got {got}")
            if strict or plugin_name in fatal:
                raise PluginError(msg)
            warnings.append(msg)
            continue
        out.extend((item, plugin_name) for item in items)
    return out


def _wrong_type(items, kind: type) -> str | None:
    """None when ``items`` is a list (or tuple) of ``kind``, else what it is instead."""
    if items is None:
        return "None"
    if not isinstance(items, (list, tuple)):
        return f"a {type(items).__name__}"
    wrong = sorted({type(i).__name__ for i in items if not isinstance(i, kind)})
    return f"a list holding {', '.join(wrong)}" if wrong else None


def _call_each(pm, hookname: str, impls, strict: bool, warnings: list[str]) -> list[tuple[Any, str]]:
    """``[(result, plugin name)]``, calling ``hookname`` of one plugin at a time; a plugin whose
    hook raises is left out with a warning (or raises :class:`PluginError` when ``strict``)."""
    out = []
    for impl in impls:
        others = [p for p in pm.get_plugins() if p is not impl.plugin]
        try:
            results = pm.subset_hook_caller(hookname, remove_plugins=others)()
        except Exception as exc:  # noqa: BLE001 - attributed to the plugin
            msg = f"plugin {impl.plugin_name!r}: {hookname}() raised {type(exc).__name__}: {exc}"
            if strict:
                raise PluginError(msg) from exc
            warnings.append(msg)
            continue
        out.append((results[0] if results else None, impl.plugin_name))
    return out


class Registry:
    """All components, variants and tasks offered by the loaded plugins.

    Build with :meth:`from_plugins`; components are keyed by ``(slot, name)``, variants and
    tasks by name.
    """

    def __init__(self, components: Iterable[Component] = (), variants: Iterable[Variant] = (),
                 warnings: list[str] | None = None, tasks: Iterable[Task] = (), slots: Iterable[Slot] = ()):
        #: slot name -> its declaration: the built-in slots (:data:`harness.slots.BUILTIN`), then plugins' ones.
        self.slots: dict[str, Slot] = {s.name: dataclasses.replace(s, plugin="harness.slots") for s in BUILTIN}
        for s in slots:
            self.add_slot(s)
        self.components: dict[tuple[str, str], Component] = {}
        self.variants: dict[str, Variant] = {}
        self.tasks: dict[str, Task] = {}
        #: slot -> default component, as declared by this registry's components (``default=True``).
        self.defaults: dict[str, str] = {}
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
            PluginError, DuplicateNameError: a ``-p``/``--plugin`` plugin with a hook problem or a hook
                returning the wrong type, a broken entry-point plugin (strict), or duplicate names.
            HarnessError: a variant naming a slot or component that nobody offers.
        """
        from .tasks.base import Task  # here: importing the registry imports no torch

        spec = spec or PluginSpec()
        warnings: list[str] = []
        pm = get_plugin_manager(spec, warnings)
        reg = cls(warnings=warnings)
        mine = spec.requested()
        for slot, plugin in sorted(_call_hook(pm, "harness_add_slots", Slot, spec.strict, warnings, mine),
                                   key=lambda sp: sp[0].name):
            reg.add_slot(dataclasses.replace(slot, plugin=plugin))
        comps = _call_hook(pm, "harness_add_components", Component, spec.strict, warnings, mine)
        for comp, plugin in sorted(comps, key=lambda cp: (cp[0].slot, cp[0].name)):
            reg.add_component(dataclasses.replace(comp, plugin=plugin))
        vars_ = _call_hook(pm, "harness_add_variants", Variant, spec.strict, warnings, mine)
        for var, plugin in sorted(vars_, key=lambda vp: vp[0].name):
            reg.add_variant(dataclasses.replace(var, slots=dict(var.slots), plugin=plugin))
        tasks = _call_hook(pm, "harness_add_tasks", Task, spec.strict, warnings, mine)
        for task, plugin in sorted(tasks, key=lambda tp: str(tp[0].name)):
            task = copy.copy(task)
            task.plugin = plugin
            reg.add_task(task)
        for comp in reg.components.values():
            reg.validate_component(comp)
        for var in reg.variants.values():
            reg.validate_variant(var)
        reg.defaults = declared_defaults(reg.components.values(), reg.slots)
        for name, var in list(reg.variants.items()):  # every slot explicit: no later caller can fall back
            reg.variants[name] = dataclasses.replace(var, slots=var.resolved(reg.defaults))  # to other defaults
        return reg

    def validate_component(self, comp: Component) -> None:
        """Check a component's declarations against the registry (see :class:`Component`)."""
        where = f"component {comp.slot}={comp.name} from plugin {comp.plugin!r}"
        if comp.fully_masked_row not in FULLY_MASKED_ROW:
            raise PluginError(f"{where}: fully_masked_row={comp.fully_masked_row!r}; allowed: "
                              f"{', '.join(FULLY_MASKED_ROW)}")
        if comp.differs and comp.equivalent_to:
            raise PluginError(f"{where}: declares both differs= and equivalent_to=; give one")
        if comp.reference and not comp.differs:
            raise PluginError(f"{where}: reference={comp.reference!r} names the formula a declared difference is held "
                              f"to; declare the difference with differs=\"...\" too")
        if not comp.has_layer_norm:
            if comp.slot != "norm":
                raise PluginError(f"{where}: has_layer_norm=False applies to the norm slot only (residual blocks)")
            if not (comp.differs or comp.equivalent_to or comp.buggy):
                raise PluginError(f"{where}: has_layer_norm=False computes neither post-norm nor pre-norm; declare "
                                  f"what it computes with differs=\"...\" (e.g. \"ReZero: x + alpha * sublayer(x), "
                                  f"no LayerNorm (Bachlechner et al. 2021)\")")
        if comp.equivalent_to:
            if comp.equivalent_to == comp.name or (comp.slot, comp.equivalent_to) not in self.components:
                raise UnknownNameError(f"{comp.slot} component", comp.equivalent_to,
                                       [n for (s, n) in self.components if s == comp.slot and n != comp.name],
                                       f"equivalent_to= of {where}")

    def add_slot(self, slot: Slot) -> None:
        """Add a plugin's slot (see :class:`harness.slots.Slot` for what it raises)."""
        if not isinstance(slot.name, str) or not slot.name.isidentifier():
            raise PluginError(f"plugin {slot.plugin!r}: slot name {slot.name!r} is not an identifier")
        if not isinstance(slot.protocol, type):
            raise PluginError(f"plugin {slot.plugin!r}: slot {slot.name!r}: protocol must be a class (a "
                              f"typing.Protocol giving the shapes), got {type(slot.protocol).__name__}")
        if slot.name in self.slots:
            raise DuplicateNameError(f"slot {slot.name!r} is declared by two plugins: "
                                     f"{self.slots[slot.name].plugin!r} and {slot.plugin!r}")
        self.slots[slot.name] = slot

    def add_component(self, comp: Component) -> None:
        if comp.slot not in self.slots:
            raise UnknownNameError("slot", comp.slot, self.slots, f"component {comp.name!r} from plugin {comp.plugin!r}")
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
        usable = [m.name for m in task.metrics if m.verdict]
        if task.primary_metric not in usable:
            raise PluginError(f"plugin {task.plugin!r}: task {task.name!r} has primary_metric "
                              f"{task.primary_metric!r}, not one of its metrics verdicts may use ({', '.join(usable)})")
        self.tasks[task.name] = task

    def task(self, name: str) -> Task:
        """The task called ``name``. Raises UnknownNameError (with close matches)."""
        if name not in self.tasks:
            raise UnknownNameError("task", name, self.tasks, "see: python -m harness list")
        return self.tasks[name]

    def validate_variant(self, var: Variant) -> None:
        for slot, comp in var.slots.items():
            if slot not in self.slots:
                raise UnknownNameError("slot", slot, self.slots, f"in variant {var.name!r} from plugin {var.plugin!r}")
            if (slot, comp) not in self.components:
                raise UnknownNameError(f"{slot} component", comp, self.slot_components(slot, True),
                                       f"in variant {var.name!r} from plugin {var.plugin!r}")

    def slot_components(self, slot: str, include_buggy: bool = False) -> list[str]:
        return [n for (s, n), c in self.components.items() if s == slot and (include_buggy or not c.buggy)]

    def component(self, slot: str, name: str) -> Component:
        if slot not in self.slots:
            raise UnknownNameError("slot", slot, self.slots)
        if (slot, name) not in self.components:
            raise UnknownNameError(f"{slot} component", name, self.slot_components(slot, True))
        return self.components[(slot, name)]

    def grid(self) -> list[Variant]:
        """The full factorial over the main slots (:func:`harness.slots.main_slots`; non-buggy components), named
        ``grid-<norm>-<embedding>-<attention>-<mask>``; other slots at their defaults.

        A component that only variants of a ``group`` use (``group:modern``'s GQA, QK-norm, sliding
        window, parallel block, packed QKV) stays in its group, as its variants stay out of ``all``:
        the grid crosses the choices of ``all`` and every component no variant names (a plugin's)."""
        main = main_slots(self.slots.values())
        grouped = {(s, c) for v in self.variants.values() if v.group for s, c in v.slots.items()}
        ungrouped = {(s, c) for v in self.variants.values() if not v.group for s, c in v.resolved(self.defaults or None).items()}
        choices = [sorted(c for c in self.slot_components(s) if (s, c) not in grouped - ungrouped) for s in main]
        out = []
        for combo in itertools.product(*choices):
            name = "grid-" + "-".join(combo)
            out.append(Variant(name, Variant(name, dict(zip(main, combo))).resolved(self.defaults or None),
                               summary=", ".join(f"{s}={c}" for s, c in zip(main, combo)),
                               source="full factorial (--grid)", plugin="harness.registry"))
        return out

    def select(self, patterns: Iterable[str] | str) -> list[Variant]:
        """Resolve ``all``, exact names and shell-style globs to variants, in name order.

        ``all`` and globs skip buggy variants unless the glob itself starts with ``bug``;
        buggy variants are selected by exact name. ``all`` also skips variants of a ``group``
        (``Variant.group``), which globs and ``group:NAME`` select.

        Raises:
            UnknownNameError: a name or glob that matches no variant (with close matches).
        """
        if isinstance(patterns, str):
            patterns = [p for p in patterns.split(",") if p.strip()]
        chosen: dict[str, Variant] = {}
        for pat in patterns:
            pat = pat.strip()
            if pat == "all":
                hits = [v for v in self.variants.values() if not v.buggy and not v.group]
            elif pat.startswith("group:"):
                hits = [v for v in self.variants.values() if v.group == pat[6:] and not v.buggy]
                if not hits:
                    raise UnknownNameError("variant group", pat[6:], sorted({v.group for v in self.variants.values()
                                                                             if v.group}), "no variant is in it")
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
