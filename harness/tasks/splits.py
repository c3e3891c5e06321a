"""A trial's three splits: the training stream, the dev set and the test set, and their measured overlaps.

* **train**: :meth:`harness.tasks.base.Task.batches` from the trial's seed.
* **test**: :func:`test_set`, ``train.eval_sequences`` sequences of :meth:`~harness.tasks.base.Task.eval_set`
  at ``train.eval_seed`` -- the same sequences as before dev sets existed, so stored test figures keep their
  meaning. Scored once, after training: the trial row's ``heldout_ce``, ``exact_match``, ``wer``, ...
* **dev**: :func:`dev_set`, :data:`DEV_SEQUENCES` sequences of the task's own dev stream (seed
  ``train.eval_seed`` + :data:`DEV_SEED_OFFSET`), disjoint from training as the test set is and from the
  test set's sources (:meth:`~harness.tasks.base.Task.dev_set`). Every periodic evaluation (the curve's
  ``dev`` rows), "solved" (``steps_to_solve``, ``time_to_solve_s``, ``train.stop_at_solved``), the
  mean dev CE over training (``heldout_auc``), the future-leak checks and the dev columns of the row
  (``dev_ce``, ``dev_exact_match``, ..., :func:`harness.metrics.dev_column`) read it; nothing the trial
  does before its final test evaluation reads the test set's targets.

:func:`heldout_note` is the line ``config.json`` records under ``heldout`` and the report prints: both
sets, their sizes and their measured overlaps. The overlaps compare sources, or for a task whose source does not
tell its sequences apart the rows its ``overlap_rows(batch)`` method gives (:func:`overlap_rows`; ``text``, whose
source is one character, compares whole windows).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import torch

from ..errors import ConfigError
from .base import Batch, Task, row_keys

if TYPE_CHECKING:
    from ..config import RunConfig

#: Sequences of the dev set: each periodic evaluation and the final dev evaluation score all of them.
DEV_SEQUENCES = 200
#: The dev stream's seed is ``train.eval_seed + DEV_SEED_OFFSET`` (the test set's is ``train.eval_seed``).
DEV_SEED_OFFSET = 1
#: Seeds of the future-leak checks' fresh dev rows: ``train.eval_seed + LEAK_SEED_OFFSET + step`` (+ 1 after training).
LEAK_SEED_OFFSET = 1000


def test_set(task: Task, cfg: "RunConfig") -> Batch:
    """The test set: ``train.eval_sequences`` sequences of ``task.eval_set`` at ``train.eval_seed``.

    Shape: src (N, S), tgt and tgt_y (N, T), N = ``train.eval_sequences`` (or the task's whole test split)."""
    tc = cfg.train
    return task.for_config(cfg).eval_set(tc.eval_sequences, tc.seq_len, cfg.model.vocab, tc.eval_seed)


def dev_set(task: Task, cfg: "RunConfig", test_src: torch.Tensor, n: int = DEV_SEQUENCES,
            seed: int | None = None) -> Batch:
    """``n`` dev sequences of ``task`` (:meth:`~harness.tasks.base.Task.dev_set`) from the dev stream's seed
    (default ``train.eval_seed + DEV_SEED_OFFSET``), none with a source among ``test_src`` (:func:`test_set`'s).

    Shape: test_src (N, S) -> src (n', S'), tgt and tgt_y (n', T), n' <= n.

    Raises:
        ConfigError: the task has no sequence outside its test set."""
    tc = cfg.train
    seed = tc.eval_seed + DEV_SEED_OFFSET if seed is None else seed
    return task.for_config(cfg).dev_set(n, tc.seq_len, cfg.model.vocab, seed, test_src)


def leak_set(task: Task, cfg: "RunConfig", test_src: torch.Tensor, dev: Batch, rows: int, step: int,
             final: bool = False) -> Batch:
    """``rows`` fresh dev rows for the future-leak check at ``step`` (never scored), the same for every seed;
    the dev set's first ``rows`` where the task has no fresh ones (an ``eval_set`` that ignores its seed)."""
    try:
        return dev_set(task, cfg, test_src, rows, cfg.train.eval_seed + LEAK_SEED_OFFSET + step + int(final))
    except ConfigError:
        return Batch(dev.src[:rows], dev.tgt[:rows], dev.tgt_y[:rows])


def overlap_rows(task: Task, batch: Batch) -> torch.Tensor:
    """The rows of ``batch`` the measured overlaps compare: its sources (B, S), or (B, W) from the task's own
    ``overlap_rows(batch)`` where it has one (a task whose source does not tell its sequences apart: ``text``)."""
    own = getattr(task, "overlap_rows", None)
    return batch.src if own is None else own(batch)


def training_sources(task: Task, cfg: "RunConfig", seed: int) -> Iterator[torch.Tensor]:
    """The source rows (:func:`overlap_rows`) of ``seed``'s training stream, batch by batch: what
    :func:`harness.train.train` draws (``steps`` batches from ``Generator().manual_seed(seed)``).

    Yields:
        ``cfg.train.steps`` tensors of shape (B, S), B = ``cfg.train.batch``.
    """
    task = task.for_config(cfg)
    stream = task.batches(cfg, torch.Generator().manual_seed(seed))
    for _ in range(cfg.train.steps):
        yield overlap_rows(task, next(stream))


def split_overlaps(task: Task, cfg: "RunConfig", seed: int) -> dict[str, tuple[int, int]]:
    """Measured overlaps of the splits: ``{"test": (test sources among seed's training sources, N), "dev":
    (dev sources among them, n), "dev_test": (dev sources among the test sources, n)}``, each repeat
    counted (all 0 for every built-in task by construction). Costs one pass of batch generation over the
    first ``steps x batch`` training sources, no model, on one intra-op thread: the batches are small ops,
    and a second thread made them 24x slower on a busy 2-core machine (0.34 s vs 8.2 s for the quick
    preset's 400 batches, docs/benchmarks.md); the caller's thread count is restored."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        test_rows = test_set(task, cfg)
        test = overlap_rows(task.for_config(cfg), test_rows)
        dev = overlap_rows(task.for_config(cfg), dev_set(task, cfg, test_rows.src))
        want = {w: set(row_keys(test, w)) | set(row_keys(dev, w)) for w in {test.size(1), dev.size(1)}}
        seen: set[bytes] = set()
        for chunk in training_sources(task, cfg, seed):
            for w, keys in want.items():
                seen.update(k for k in row_keys(chunk, w) if k in keys)
    finally:
        torch.set_num_threads(threads)
    test_keys = set(row_keys(test, dev.size(1)))
    return {"test": (sum(k in seen for k in row_keys(test, test.size(1))), test.size(0)),
            "dev": (sum(k in seen for k in row_keys(dev, dev.size(1))), dev.size(0)),
            "dev_test": (sum(k in test_keys for k in row_keys(dev, dev.size(1))), dev.size(0))}


def heldout_overlap(task: Task, cfg: "RunConfig", seed: int) -> tuple[int, int]:
    """``(overlap, N)``: the test set's sources that occur verbatim among seed ``seed``'s training sources
    (:func:`split_overlaps`' ``test``)."""
    return split_overlaps(task, cfg, seed)["test"]


def heldout_note(task: Task, cfg: "RunConfig", seed: int) -> str:
    """One line for ``config.json`` and the report: both sets, their sizes and measured overlaps, e.g. ``test
    set: 1000 sequences of content length 2-10, disjoint from training by construction (hash split, 1 in 5 held
    out); measured overlap with seed 0's training stream: 0/1000. dev set: 200 sequences ...; measured overlap
    with seed 0's training stream: 0/200, with the test set: 0/200``."""
    o = split_overlaps(task, cfg, seed)
    tc, vocab, task = cfg.train, cfg.model.vocab, task.for_config(cfg)
    (test, n), (dev, m), (both, _) = o["test"], o["dev"], o["dev_test"]
    return (f"test set: {n} {task.split_note(tc.seq_len, vocab)}; measured overlap with seed {seed}'s training "
            f"stream: {test}/{n}. dev set: {m} {task.dev_note(tc.seq_len, vocab)} "
            f"(seed {tc.eval_seed + DEV_SEED_OFFSET}); "
            f"measured overlap with seed {seed}'s training stream: {dev}/{m}, with the test set: {both}/{m}")
