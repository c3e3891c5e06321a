"""Built-in tasks: ``copy`` (default), ``copy_fixed``, ``reverse``, ``sort``, ``copy_length``, ``g2p``.

Registered through ``harness_add_tasks`` exactly like a plugin's tasks; the implementations and
their sources are in :mod:`harness.tasks.copy`, :mod:`harness.tasks.algorithmic` and
:mod:`harness.tasks.g2p` (real data: the CMU Pronouncing Dictionary).
"""
from __future__ import annotations

from harness import hookimpl
from harness.tasks.algorithmic import ReverseTask, SortTask
from harness.tasks.copy import CopyFixedTask, CopyLengthTask, CopyTask
from harness.tasks.g2p import G2PTask


@hookimpl
def harness_add_tasks():
    return [CopyTask(), CopyFixedTask(), ReverseTask(), SortTask(), CopyLengthTask(), G2PTask()]
