"""Built-in tasks: ``copy`` (default), ``copy_fixed``, ``reverse``, ``sort``, ``copy_length``.

Registered through ``harness_add_tasks`` exactly like a plugin's tasks; the implementations and
their sources are in :mod:`harness.tasks.copy` and :mod:`harness.tasks.algorithmic`.
"""
from __future__ import annotations

from harness import hookimpl
from harness.tasks.algorithmic import ReverseTask, SortTask
from harness.tasks.copy import CopyFixedTask, CopyLengthTask, CopyTask


@hookimpl
def harness_add_tasks():
    return [CopyTask(), CopyFixedTask(), ReverseTask(), SortTask(), CopyLengthTask()]
