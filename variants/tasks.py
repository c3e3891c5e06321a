"""Built-in tasks: ``copy`` (default), ``copy_fixed``, ``reverse``, ``sort``, ``copy_length``, ``g2p``, ``text``.

Registered through ``harness_add_tasks`` exactly like a plugin's tasks; the implementations and
their sources are in :mod:`harness.tasks.copy`, :mod:`harness.tasks.algorithmic`,
:mod:`harness.tasks.g2p` (real data: the CMU Pronouncing Dictionary) and :mod:`harness.tasks.text`
(real data: Tiny Shakespeare, a character-level language model).
"""
from __future__ import annotations

from harness import hookimpl
from harness.tasks.algorithmic import ReverseTask, SortTask
from harness.tasks.copy import CopyFixedTask, CopyLengthTask, CopyTask
from harness.tasks.g2p import G2PTask
from harness.tasks.text import TextTask


@hookimpl
def harness_add_tasks():
    return [CopyTask(), CopyFixedTask(), ReverseTask(), SortTask(), CopyLengthTask(), G2PTask(), TextTask()]
