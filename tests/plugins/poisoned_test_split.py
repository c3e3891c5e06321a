"""A task whose test split is poisoned: ``copy_poisoned`` is the copy task (same training batches,
same dev set) except that its test set -- :meth:`eval_set` at the presets' ``train.eval_seed`` -- keeps
its sources and asks for garbage: every label is the last content id. A trial that read the test set
before its final evaluation (a periodic evaluation, "solved", early stopping, a leak check) would move
with it; ``tests/test_dev_split.py`` trains ``copy`` and ``copy_poisoned`` side by side and shows that
only the test metrics move.
"""
from __future__ import annotations

import torch

from harness import hookimpl
from harness.tasks import PAD, START, Batch
from harness.tasks.copy import CopyTask

#: ``train.eval_seed`` of every preset: the seed of the test set (:func:`harness.tasks.splits.test_set`).
TEST_SEED = 1234


class PoisonedTestTask(CopyTask):
    """``copy_poisoned``: ``copy`` with the test set's labels all ``V - 1`` (sources unchanged)."""

    name = "copy_poisoned"
    summary = "the copy task with a poisoned test set (every test label the last id); a test's plugin"
    source = "tests/plugins/poisoned_test_split.py"

    def eval_set(self, n, seq_len, vocab, seed):
        b = super().eval_set(n, seq_len, vocab, seed)
        if seed != TEST_SEED:
            return b
        labels = b.tgt_y.masked_fill(b.tgt_y != PAD, vocab - 1)  # (n, T) garbage where a label is scored
        tgt = torch.cat([torch.full_like(labels[:, :1], START), labels[:, :-1]], dim=1)  # (n, T) labels shifted right
        return Batch(b.src, tgt, labels)


@hookimpl
def harness_add_tasks():
    return [PoisonedTestTask()]
