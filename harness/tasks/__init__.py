"""Tasks: what trials train on and are scored on (:class:`Task`, ``docs/tasks.md``).

Built-in tasks live in :mod:`harness.tasks.copy` and :mod:`harness.tasks.algorithmic` and are
registered by ``variants/tasks.py`` through the ``harness_add_tasks`` hook, like any plugin's.
"""
from __future__ import annotations

from .base import END, PAD, START, Batch, Task, count_overlap, heldout_note, heldout_overlap, training_sources
from .copy import HashSplitTask

__all__ = ["Task", "HashSplitTask", "Batch", "PAD", "START", "END", "get_task", "count_overlap", "heldout_note",
           "heldout_overlap", "training_sources"]


def get_task(name: str, registry=None) -> Task:
    """The task called ``name``, from ``registry`` or else from the default registry (built-ins and
    installed entry points, cached per process).

    Raises:
        UnknownNameError: no task of that name (with close matches).
    """
    if registry is None:
        from ..trial import registry_for as _registry

        registry = _registry(None)
    return registry.task(name)
