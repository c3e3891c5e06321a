"""A task with its own metric, in one file: ``copy_bits``, the copy task scored also in bits.

``heldout_bits`` is the held-out cross-entropy in bits per token (``heldout_ce / ln 2``, the unit of
the compression literature), declared once as a :class:`harness.metrics.Metric` and returned by
:meth:`CopyBitsTask.evaluate` under its name. The declaration alone puts it in ``trials.csv``, the
report's main table and caption, ``final_metrics.png``, ``compare``'s gate and ``--metric``
(``tests/test_metrics.py`` loads this file with ``--plugin`` and checks each place). docs/tasks.md
("A task with its own metric") shows the same file.
"""
from __future__ import annotations

import math

from harness import hookimpl
from harness.metrics import COPY_METRICS, Metric
from harness.tasks.copy import CopyTask

HELDOUT_BITS = Metric("heldout_bits", higher_is_better=False, unit="bits/token",
                      text="held-out cross-entropy in bits (heldout_ce / ln 2)", column="held-out bits IQM [95% CI]")


class CopyBitsTask(CopyTask):
    """``copy_bits``: the copy task (same batches and held-out set), scored also in bits per token."""

    name = "copy_bits"
    summary = "the copy task, its held-out cross-entropy also in bits per token (a plugin's own metric)"
    source = "tests/plugins/task_metric.py (Shannon 1948: bits = nats / ln 2)"
    metrics = COPY_METRICS + (HELDOUT_BITS,)
    primary_metric = "heldout_bits"

    def evaluate(self, *args, **kwargs) -> dict[str, float]:
        m = super().evaluate(*args, **kwargs)
        return {**m, "heldout_bits": m["heldout_ce"] / math.log(2)}


@hookimpl
def harness_add_tasks():
    return [CopyBitsTask()]
