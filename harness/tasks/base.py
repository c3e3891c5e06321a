"""The task interface: what a trial trains on and is scored on.

A *task* draws training batches, provides a held-out evaluation set that never overlaps the
training stream, and is scored by the exact match of greedy decoding (the metric that defines
"solved", see :data:`harness.train.SOLVED`). Built-in tasks are registered by ``variants/tasks.py``
through the ``harness_add_tasks`` hook, exactly like a plugin's (see ``docs/tasks.md``).

Batch convention (every task): token ids with 0 = pad, 1 = start, 2 = end; ``src`` (B, S)
source ids, ``tgt`` (B, T) decoder input (starts with 1), ``tgt_y`` (B, T) labels (``tgt``
shifted left by one; the non-pad labels are what greedy decoding must reproduce, usually the
answer followed by 2). Shape letters: B rows, S source length, T target length, L =
``train.seq_len``, V = ``model.vocab``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

import torch

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..config import RunConfig

PAD, START, END = 0, 1, 2


@dataclass
class Batch:
    """One batch: ``src`` (B, S), ``tgt`` (B, T) decoder input, ``tgt_y`` (B, T) labels."""

    src: torch.Tensor
    tgt: torch.Tensor
    tgt_y: torch.Tensor

    @property
    def ntokens(self) -> int:
        """Label tokens that count (not pad)."""
        return int((self.tgt_y != PAD).sum())

    def to(self, device) -> "Batch":
        return Batch(self.src.to(device), self.tgt.to(device), self.tgt_y.to(device))


class Task:
    """Base class of every task (built-in or plugin). Subclass it, set the three class
    attributes and implement :meth:`make_batch` and :meth:`eval_set`; override the others
    when the defaults do not fit.

    Attributes:
        name: unique task name, used by ``--task NAME`` and stored in ``train.task``.
        summary: one line for ``list`` and reports: what the model must output.
        source: where the task comes from (paper section, tutorial, seed note).
        plugin: set by the registry: the plugin that offered the task.

    Scoring: a held-out sequence counts as solved when greedy decoding reproduces every
    non-pad label of ``tgt_y`` (:meth:`score`); ``harness.train.evaluate`` computes it for every
    task, so a task defines what is right through its labels.
    """

    name: str = ""
    summary: str = ""
    source: str = ""
    plugin: str = ""

    def make_batch(self, batch: int, seq_len: int, vocab: int, generator: torch.Generator) -> Batch:
        """One training batch drawn on the CPU from ``generator`` (advanced in place); never a
        sequence of the evaluation set. Deterministic given the generator's state.

        Args:
            batch: rows B.
            seq_len: the task's length parameter L (``train.seq_len``).
            vocab: vocabulary size V (ids 3..V-1 are free for content).
            generator: the CPU generator (the trial seeds it with its seed).

        Shape:
            src (B, S), tgt and tgt_y (B, T), S and T at most :meth:`widths`.
        """
        raise NotImplementedError

    def eval_set(self, n: int, seq_len: int, vocab: int, seed: int) -> Batch:
        """The fixed held-out set: ``n`` sequences drawn from ``seed``, none of which
        :meth:`make_batch` ever returns (for any generator state).

        Shape:
            src (n, S), tgt and tgt_y (n, T).
        """
        raise NotImplementedError

    def widths(self, seq_len: int) -> tuple[int, int]:
        """(S, T): the longest source and target rows of training batches and evaluation sets.
        Default (L, L + 1): content of length <= L, answer plus the end symbol."""
        return seq_len, seq_len + 1

    def validate(self, cfg: "RunConfig") -> None:
        """Raise :class:`harness.errors.ConfigError` when ``cfg`` cannot run this task (with the
        value it needs). Default: the positional encoding covers :meth:`widths` plus one
        position (``model.max_len >= max(S, T) + 1``)."""
        s, t = self.widths(cfg.train.seq_len)
        need = max(s, t) + 1
        if cfg.model.max_len < need:
            raise ConfigError(f"the {self.name} task at train.seq_len={cfg.train.seq_len} uses rows of up to "
                              f"{max(s, t)} tokens: it needs model.max_len >= {need}, got {cfg.model.max_len}")

    def split_note(self, seq_len: int, vocab: int) -> str:
        """How the evaluation set is kept out of training, after "evaluation set: N", e.g.
        ``sequences of content length 2-10, disjoint from training by construction (...)``."""
        return "sequences disjoint from training"

    @staticmethod
    def score(pred: torch.Tensor, tgt_y: torch.Tensor, pad: int = PAD) -> torch.Tensor:
        """Per-sequence exact match: every non-pad label predicted (later positions unscored).

        Shape: pred, tgt_y (B, T) -> (B,) bool.
        """
        keep = tgt_y != pad
        return ((pred == tgt_y) | ~keep).all(dim=1)

    def __repr__(self) -> str:
        return f"<task {self.name!r} from {self.plugin or '?'}>"


def count_overlap(eval_src: torch.Tensor, train_src) -> int:
    """Rows of ``eval_src`` (N, S) that occur verbatim among the rows of ``train_src``.

    Rows of different widths are compared with trailing pads removed (a source row of length
    S and one of S' > S that only adds pads are the same sequence).

    Args:
        eval_src: (N, S) evaluation source rows (each repeat counts).
        train_src: (M, S') training source rows, or an iterable of (B_i, S') chunks.

    Returns:
        the number of evaluation rows, in 0..N, equal to some training row.
    """
    chunks = [train_src] if isinstance(train_src, torch.Tensor) else train_src
    seen: set[bytes] = set()
    width = eval_src.size(1)
    for chunk in chunks:
        seen.update(_keys(chunk, width))
    return sum(k in seen for k in _keys(eval_src, width))


def _keys(rows: torch.Tensor, width: int) -> list[bytes]:
    """Row keys at a common width: rows narrower than ``width`` are padded; wider ones keep
    their width (their content beyond ``width`` cannot match a row of ``width``)."""
    if rows.size(1) < width:
        rows = torch.nn.functional.pad(rows, (0, width - rows.size(1)), value=PAD)
    elif rows.size(1) > width and bool((rows[:, width:] == PAD).all()):
        rows = rows[:, :width]
    return [row.tobytes() for row in rows.contiguous().numpy()]


def training_sources(task: Task, cfg: "RunConfig", seed: int) -> Iterator[torch.Tensor]:
    """The source rows of ``seed``'s training stream, batch by batch: what
    :func:`harness.train.train` draws (``steps`` batches from ``Generator().manual_seed(seed)``).

    Yields:
        ``cfg.train.steps`` tensors of shape (B, S), B = ``cfg.train.batch``.
    """
    tc = cfg.train
    generator = torch.Generator().manual_seed(seed)
    for _ in range(tc.steps):
        yield task.make_batch(tc.batch, tc.seq_len, cfg.model.vocab, generator).src


def heldout_overlap(task: Task, cfg: "RunConfig", seed: int) -> tuple[int, int]:
    """Measured overlap of the final evaluation set with a seed's training stream: the
    ``eval_sequences`` sources of ``task.eval_set(..., eval_seed)`` that occur verbatim among the
    first ``steps x batch`` training sources of ``seed`` (0 for every built-in task by
    construction). Costs one pass of batch generation, no model.

    Returns:
        ``(overlap, n)``: overlapping evaluation sequences (each repeat counts) and n.
    """
    tc = cfg.train
    data = task.eval_set(tc.eval_sequences, tc.seq_len, cfg.model.vocab, tc.eval_seed)
    return count_overlap(data.src, training_sources(task, cfg, seed)), data.src.size(0)


def heldout_note(task: Task, cfg: "RunConfig", seed: int) -> str:
    """One line for a report: the split and the measured overlap, e.g. ``evaluation set: 1000
    sequences of content length 2-10, disjoint from training by construction (hash split, 1 in 5
    held out); measured overlap with seed 0's training stream: 0/1000``."""
    overlap, n = heldout_overlap(task, cfg, seed)
    return (f"evaluation set: {n} {task.split_note(cfg.train.seq_len, cfg.model.vocab)}; measured overlap "
            f"with seed {seed}'s training stream: {overlap}/{n}")
