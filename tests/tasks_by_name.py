"""Built-in tasks by name, for tests: the default registry's task called NAME
(:func:`harness.trial.registry_for`), then its method. The core passes :class:`harness.Task`
objects and never looks a task up by name in ``harness/tasks/`` (a leaf under the registry);
these helpers lived in ``harness/tasks/copy.py`` while only tests used them."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from harness.tasks.base import Batch, Task
from harness.tasks.splits import heldout_note as _heldout_note
from harness.tasks.splits import heldout_overlap as _heldout_overlap
from harness.tasks.splits import training_sources as _training_sources
from harness.trial import registry_for

if TYPE_CHECKING:
    from harness.config import RunConfig


def task_named(name: str) -> Task:
    """The task called ``name`` in the default registry (:func:`harness.trial.registry_for`).

    Raises:
        UnknownNameError: no task of that name.
    """
    return registry_for(None).task(name)


def make_batch(task: str, batch: int, seq_len: int, vocab: int, generator: torch.Generator) -> Batch:
    """Draw one training batch of the task named ``task`` (``Task.make_batch``) on the CPU; never a
    held-out sequence.

    The layout is in :mod:`harness.tasks.copy`'s docstring; rows are uniform over the training split of their
    content length (the split: :func:`harness.tasks.copy.split_class`). Deterministic given the generator's state.

    Args:
        task: a registered task name (built-ins: ``copy``, ``copy_fixed``, ``reverse``, ``sort``,
            ``copy_length``).
        batch: rows B.
        seq_len: longest content length L (``copy``) or row length (``copy_fixed``).
        vocab: vocabulary size V.
        generator: the CPU generator the rows are drawn from (advanced in place).

    Shape:
        ``copy``: src (B, L), tgt and tgt_y (B, L+1). ``copy_fixed``: src (B, L), tgt and tgt_y
        (B, L-1).

    Raises:
        UnknownNameError: unknown ``task``.
        ConfigError: no held-out split exists for ``vocab`` / ``seq_len`` (:func:`harness.tasks.copy.heldout_classes`).
    """
    return task_named(task).make_batch(batch, seq_len, vocab, generator)


def eval_set(task: str, n: int, seq_len: int, vocab: int, seed: int) -> Batch:
    """The fixed held-out set of the task named ``task``: ``n`` held-out sequences drawn from
    ``seed`` (shared by every trial).

    ``copy``: content lengths are uniform over :func:`harness.tasks.copy.eval_lengths` (2..L; length 1 is never held
    out, see the module docstring); the content is uniform over the held-out sequences of that
    length, none of which :func:`make_batch` ever returns. Sequences may repeat within the set
    (13 of the 64 length-2 sequences are held out at the quick preset).

    Shape:
        as :func:`make_batch` with B = n.

    Raises:
        as :func:`make_batch`.
    """
    return task_named(task).eval_set(n, seq_len, vocab, seed)


def training_sources(cfg: "RunConfig", seed: int):
    """The source rows of ``seed``'s training stream on ``cfg.train.task``
    (:func:`harness.tasks.base.training_sources`)."""
    return _training_sources(task_named(cfg.train.task), cfg, seed)


def heldout_overlap(cfg: "RunConfig", seed: int) -> tuple[int, int]:
    """Measured overlap of the final evaluation set with a seed's training stream
    (:func:`harness.tasks.base.heldout_overlap` for ``cfg.train.task``). The pre-split code gave
    397/1000 at the quick preset, seed 0; about 0.4 s at the quick preset on a 2-core CPU."""
    return _heldout_overlap(task_named(cfg.train.task), cfg, seed)


def heldout_note(cfg: "RunConfig", seed: int) -> str:
    """One line for a report (:func:`harness.tasks.base.heldout_note` for ``cfg.train.task``)."""
    return _heldout_note(task_named(cfg.train.task), cfg, seed)
