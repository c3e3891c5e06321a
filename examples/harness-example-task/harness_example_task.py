"""Example transformer-harness task plugin: ``shift`` -- output every source token shifted by one.

The model reads content ids x_1..x_n from 3..V-1 and must answer x_i + 1 for each (V-1 wraps
around to 3), then the end symbol: a per-position substitution (a Caesar shift of the ids), the
simplest task whose output is not a copy of its input. It reuses the built-in padded layout and
the held-out hash split through :class:`harness.tasks.HashSplitTask`, so its evaluation sources
never occur in training.

Load it either way:

* ``python -m harness --plugin examples/harness-example-task/harness_example_task.py run --task shift``
* ``pip install -e examples/harness-example-task`` (entry point group ``harness``), then
  ``python -m harness run --task shift``.
"""
from __future__ import annotations

import torch

from harness import hookimpl
from harness.tasks import PAD, HashSplitTask


class ShiftTask(HashSplitTask):
    """``shift``: src ``[5, 10, 3, 0]`` -> tgt_y ``[6, 3, 4, 2, 0]`` at V = 11 (ids 3..10).

    Source: a Caesar cipher on token ids, a standard toy substitution task.
    """

    name = "shift"
    summary = "output every source id plus one (V-1 wraps to 3); content length 1..L with padding"
    source = "examples/harness-example-task (Caesar shift of the ids)"

    def answer(self, src: torch.Tensor, length: torch.Tensor, vocab: int) -> torch.Tensor:
        low = 3
        shifted = (src - low + 1).remainder(vocab - low) + low  # (B, W) ids 3..V-1
        return shifted.masked_fill(src == PAD, PAD)


@hookimpl
def harness_add_tasks():
    return [ShiftTask()]
