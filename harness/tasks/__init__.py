"""Tasks: what trials train on and are scored on (:class:`Task`, ``docs/tasks.md``).

Built-in tasks live in :mod:`harness.tasks.copy`, :mod:`harness.tasks.algorithmic` and
:mod:`harness.tasks.g2p` (a trial's train / dev / test splits: :mod:`harness.tasks.splits`) and are
registered by ``variants/tasks.py`` through the ``harness_add_tasks`` hook, like any plugin's.
``harness/tasks/`` is a leaf under the registry: it never imports it; a task is found by name through
the registry (``Registry.task(name)``; a worker's registry: :func:`harness.trial.registry_for`).
"""
from __future__ import annotations

from .base import END, PAD, START, Batch, Task, count_overlap
from .copy import HashSplitTask
from .splits import DEV_SEQUENCES, dev_set, heldout_note, heldout_overlap, split_overlaps, test_set, training_sources

__all__ = ["Task", "HashSplitTask", "Batch", "PAD", "START", "END", "count_overlap", "heldout_note",
           "heldout_overlap", "training_sources", "split_overlaps", "test_set", "dev_set", "DEV_SEQUENCES"]
