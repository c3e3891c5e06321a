"""Hook specifications: the whole plugin contract of the harness.

A plugin is any module or object with functions decorated by ``harness.hookimpl`` whose
names match the specs below. Every hook returns a *list*; the host flattens the lists of
all plugins, sorts the items by name (pluggy calls plugins last-registered first, so the
order of hook results carries no meaning) and rejects duplicate names with an error that
names both plugins (:class:`harness.errors.DuplicateNameError`).
"""
from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("harness")


@hookspec
def harness_add_slots():
    """Offer new slots: axes of choice beside the built-in ones (:data:`harness.slots.BUILTIN`).

    When it fires: as :func:`harness_add_components`, before it (a component names its slot).

    How results combine: concatenated and sorted by name; a name declared twice, or the name of a
    built-in slot, is an error naming both plugins. A new slot needs exactly one component declaring
    ``default=True``. The assembler (:mod:`harness.model`) builds only the built-in slots; a new
    slot's components are made by other components that ask for them, ``ctx.make("slot name")``
    (docs/plugins.md, "A new slot").

    Returns:
        list[harness.Slot]: may be empty.

    Raises:
        As for :func:`harness_add_components`; a slot whose name is not an identifier or whose
        protocol is not a class is a :class:`harness.errors.PluginError` naming the plugin.
    """


@hookspec
def harness_add_components():
    """Offer components: implementations of one slot each.

    When it fires: once per plugin manager, when :func:`harness.registry.Registry.from_plugins`
    builds a registry (for ``run``, ``list``, ``check``, ``bench`` and in every worker process).

    How results combine: the lists of every plugin are concatenated and sorted by
    ``(slot, name)``. A ``(slot, name)`` pair offered twice is an error naming both plugins.

    Returns:
        list[harness.Component]: may be empty.

    Raises:
        Anything the hook raises is reported as :class:`harness.errors.PluginError` naming
        the plugin; returning something that is not a list of ``Component`` is one too.
    """


@hookspec
def harness_add_variants():
    """Offer variants: named assignments of a component to slots.

    When it fires: as :func:`harness_add_components`, after it.

    How results combine: concatenated and sorted by name; a name offered twice is an
    error naming both plugins. Slots a variant leaves out take the default component of
    the slot (the one declaring ``Component(..., default=True)``, see
    :func:`harness.registry.default_components`). Every component a variant names must be
    offered by some plugin.

    Returns:
        list[harness.Variant]: may be empty.

    Raises:
        As for :func:`harness_add_components`.
    """


@hookspec
def harness_add_tasks():
    """Offer tasks: what trials train on and are scored on (``--task NAME``).

    When it fires: as :func:`harness_add_components`, after :func:`harness_add_variants`.

    How results combine: concatenated and sorted by name; a name offered twice is an error
    naming both plugins. ``train.task`` (default ``copy``) must name one of them; ``run`` and
    ``bench`` check it, with close matches for an unknown name.

    Returns:
        list[harness.Task]: instances of :class:`harness.Task` subclasses; may be empty.

    Raises:
        As for :func:`harness_add_components`; a task without a name is a
        :class:`harness.errors.PluginError` naming the plugin.
    """
