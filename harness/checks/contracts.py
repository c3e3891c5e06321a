"""Slot contracts: what a component of each slot must compute, and the checks that hold every
component -- built-in or plugin -- to it.

Shape letters: B batch, L length, S source length, T target length, D = d_model, H = h heads,
d_k = D / H, V vocabulary.

Every slot has a *reference* (:data:`~harness.checks.contract_base.SLOT_REFERENCES`). A component
is held to it unless its own registration says otherwise (:class:`harness.registry.Component`):

* ``differs="..."`` -- a deliberate difference (RMSNorm, another scaling, an approximation): the
  check measures and reports its size instead of failing;
* ``equivalent_to="other"`` -- held to another component of the slot instead;
* ``buggy=True`` -- a faithful reproduction of a bug: the checks must flag it;
* ``differs="..."`` with ``reference="NAME"`` -- held to the independent formula NAME
  (:mod:`harness.checks.formulas`: RoPE, ALiBi, learned positions, RMSNorm, GELU, SwiGLU, GEGLU)
  and the size of the declared difference from the slot's reference reported.

Each component is checked *on its own*: its siblings are the harness's own reference
implementations (a -inf keep-mask, ``nn.LayerNorm``, ``nn.Linear``), so a failure is attributed
to the component that causes it. On a failure the check tries the common ways hand-written code
goes wrong (:data:`~harness.checks.contract_attention.ATTENTION_FAULTS`, mask shifts, ...) and
names the one that reproduces the measured output ("scores divided by d_model instead of
sqrt(d_k)", "causal mask shifted by +1: position i attends to position i+1").

The reference computations run in float64; a component passes when max |component - reference|
<= atol + rtol * max |reference| with :data:`~harness.checks.policy.COMPONENT_ATOL`,
:data:`~harness.checks.policy.COMPONENT_RTOL` (float32 rounding inside a component, such as a float32
softmax, stays far below; every fault this module knows is above).

Sources: Vaswani et al. 2017 §3.2-3.5; Ba et al. 2016 (LayerNorm); Xiong et al. 2020 (pre-/post-norm);
PyTorch ``nn.MultiheadAttention`` / ``nn.LayerNorm`` / ``nn.Linear``; the study notes' bugs.

This module holds the registry-level part (:data:`CHECKS`, :func:`slot_check`, :func:`check_contracts`, the
declared relations); the slot checks live in :mod:`harness.checks.contract_base` (results,
verdicts, reference siblings,
:data:`~harness.checks.contract_base.SLOT_REFERENCES`), :mod:`harness.checks.contract_attention`
(attention, mask, :data:`~harness.checks.contract_attention.ATTENTION_FAULTS`) and
:mod:`harness.checks.contract_layers` (layer_norm, norm, embedding, projections) and
:mod:`harness.checks.contract_positions` (positional, feed_forward) and :mod:`harness.checks.contract_init` (init).
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Callable

from ..config import ModelConfig
from ..errors import PluginError
from ..registry import Component, Registry
from ..slots import Slot, builtin_slot
from .contract_attention import check_attention
from .contract_init import check_init
from .contract_mask import check_mask
from .contract_base import PLUGIN_SIBLINGS, ComponentResult, reference_components, sibling_context
from .contract_architecture import check_architecture
from .contract_layers import check_embedding, check_layer_norm, check_norm, check_projections
from .contract_positions import check_feed_forward, check_positional
from .inputs import CHECK_MODEL


#: The contract checks a slot can name (``Slot.check``), by function name.
CHECKS: dict[str, Callable[..., list[ComponentResult]]] = {fn.__name__: fn for fn in (
    check_attention, check_mask, check_layer_norm, check_norm, check_positional, check_embedding,
    check_projections, check_feed_forward, check_init, check_architecture)}


def slot_check(slot: Slot) -> Callable[..., list[ComponentResult]] | None:
    """The contract check ``slot.check`` names: a function of :data:`CHECKS`, or ``"package.module:function"``
    (a plugin's slot); None when the slot names none.

    Raises:
        PluginError: a name that :data:`CHECKS` lacks, or an import path that does not resolve.
    """
    if not slot.check:
        return None
    if ":" in slot.check:
        module, _, attr = slot.check.partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:
            raise PluginError(f"slot {slot.name!r} from plugin {slot.plugin!r}: check={slot.check!r} does not "
                              f"resolve ({type(exc).__name__}: {exc})") from exc
    if slot.check not in CHECKS:
        raise PluginError(f"slot {slot.name!r} from plugin {slot.plugin!r}: check={slot.check!r} is not a contract "
                          f"check; known: {', '.join(sorted(CHECKS))} (or 'package.module:function')")
    return CHECKS[slot.check]


def check_component(comp: Component, cfg: ModelConfig, seed: int = 0, slot: Slot | None = None) -> list[ComponentResult]:
    """Hold one component to its slot's reference (the check its :class:`~harness.slots.Slot` names;
    ``slot`` defaults to the built-in slot of ``comp.slot``). Never raises for a failing component; a slot
    without a check gives no result.

    Raises:
        PluginError: the slot names a check that does not exist (:func:`slot_check`).
    """
    slot = slot or builtin_slot(comp.slot)
    fn = slot_check(slot) if slot else None
    return fn(comp, cfg, seed) if fn else []


def check_contracts(registry: Registry, keys: list[tuple[str, str]], cfg: ModelConfig,
                     seed: int = 0) -> list[ComponentResult]:
    """:func:`check_component` for each ``(slot, name)`` in ``keys``; a plugin's slots take their default
    component as the sibling (:data:`~harness.checks.contract_base.PLUGIN_SIBLINGS`)."""
    token = PLUGIN_SIBLINGS.set({s: registry.component(s, registry.defaults[s]) for s in registry.slots
                                 if builtin_slot(s) is None and s in registry.defaults})
    try:
        return _check_each(registry, keys, cfg, seed)
    finally:
        PLUGIN_SIBLINGS.reset(token)


def _check_each(registry: Registry, keys: list[tuple[str, str]], cfg: ModelConfig, seed: int) -> list[ComponentResult]:
    out = []
    for slot, name in keys:
        comp = registry.component(slot, name)
        if comp.equivalent_to and reference_key(registry, slot, name, cfg).startswith("reference"):
            # equivalent to a component held to the reference: held to the reference itself
            comp = dataclasses.replace(comp, equivalent_to="")
        elif comp.equivalent_to and declared_formula(registry, comp):
            # equivalent to a component held to a formula: held to that formula itself
            target = declared_formula(registry, comp)
            comp = dataclasses.replace(comp, equivalent_to="", differs=target.differs, reference=target.reference)
        out += check_component(comp, cfg, seed, registry.slots.get(slot))
    return out


# --------------------------------------------------------------------------- declared relations

def declared_formula(registry: Registry, comp: Component, _seen: frozenset = frozenset()) -> Component | None:
    """The component whose ``reference=`` formula ``comp`` is held to, following ``equivalent_to=``
    (None when the chain ends at no formula)."""
    if comp.reference:
        return comp
    if comp.equivalent_to and comp.equivalent_to not in _seen:
        target = registry.components.get((comp.slot, comp.equivalent_to))
        return declared_formula(registry, target, _seen | {comp.name}) if target else None
    return None


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
        try:
            mod = comp.factory(sibling_context(cfg or CHECK_MODEL, reference_components(norm=comp)))
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
