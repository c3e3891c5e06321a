"""The inputs the properties run on besides the check's own batch: rows the trial's task drew (:func:`task_rows`)
and the run gate's padded batch (:func:`gate_batch`)."""
from __future__ import annotations

import torch

from ...config import DEFAULT_PRESET, ModelConfig, get_preset
from ...errors import HarnessError
from ..inputs import padded_batch, starting


#: Rows :func:`task_rows` draws: enough for padded and full rows of every length the task draws.
TASK_ROWS = 8


def task_rows(task, seq_len: int, cfg: ModelConfig, seed: int = 0):
    """:data:`TASK_ROWS` rows drawn by ``task`` (its ``make_batch`` from a generator of its own: the trial's random
    streams are not touched) as ``(src (B, S), tgt (B, T), tgt_y (B, T))``, for :func:`run_probes`'s task-row
    probes; None when the task cannot draw them (the drawn-row probes still run)."""
    try:
        b = task.make_batch(TASK_ROWS, seq_len, cfg.vocab, torch.Generator().manual_seed(seed + 7919))
        rows = (b.src, b.tgt, b.tgt_y)
    except Exception:  # noqa: BLE001 - a task that cannot draw probe rows loses these probes, nothing else
        return None
    fits = max(x.size(1) for x in rows) <= cfg.max_len and max(int(x.max()) for x in rows) < cfg.vocab
    return rows if fits and bool((rows[1][:, 0] != cfg.pad).all()) else None


def preset_task_rows(registry, preset: str | None, cfg: ModelConfig, seed: int = 0):
    """:func:`task_rows` of ``preset``'s task (:data:`harness.config.DEFAULT_PRESET`'s without one) at ``cfg``'s
    vocabulary and ``preset``'s ``train.seq_len``: what ``check`` probes beside its drawn batch. None when that task
    is not registered or cannot draw rows this model takes."""
    train = get_preset(preset or DEFAULT_PRESET).train
    try:
        task = registry.task(train.task)
    except HarnessError:
        return None
    return task_rows(task, train.seq_len, cfg, seed)



def gate_batch(cfg: ModelConfig, rows: int = 6, src_len: int = 9, tgt_len: int = 10, seed: int = 0,
               long_rows: int = 2):
    """The run gate's padded batch: ``(src (B, S), tgt (B, T), labels (B, T))``; target rows start
    with the start symbol 1 when the vocabulary has one, row i < ``rows`` ends with min(i, L - 2) pad tokens,
    and ``long_rows`` more as long as ``max_len`` (up to :data:`~harness.checks.policy.LONGEST_ROW`;
    :func:`~harness.checks.inputs.padded_batch`), so
    every gate item also sees the positions a long training row reaches."""
    s, t = min(src_len, cfg.max_len - 3), min(tgt_len, cfg.max_len)
    return starting(padded_batch(cfg, rows, s, t, seed=seed, long_rows=long_rows), cfg)

