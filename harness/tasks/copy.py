"""The copy task: the model must reproduce its source sequence.

Two versions (``TrainConfig.task``):

* ``copy`` -- seed 001's ``generate_data``: vocabulary V with 0 = pad, 1 = start, 2 = end;
  each row draws a content length n in 1..L uniformly and n content tokens from 3..V-1;
  ``src`` (B, L) = content then pad, ``tgt`` (B, L+1) = [1, content, 2, pad...][:-1] (decoder
  input) and ``tgt_y`` (B, L+1) = [content, 2, pad...] (labels). Source padding is real, so
  padding masks matter.
* ``copy_fixed`` -- the Annotated Transformer's ``data_gen``: ``data = randint(1, V, (B, L))``
  with ``data[:, 0] = 1``, ``src = data``, ``tgt = data[:, :-1]``, ``tgt_y = data[:, 1:]``; no
  padding. Its content is ``data[:, 1:]``: L - 1 tokens from 1..V-1 (start and end ids included,
  as in the Annotated code).

Batches are drawn on the CPU from a ``torch.Generator`` and then moved to the device, so the
same seed gives the same data on every device and for every variant (paired seeds).

Held-out split (standard train/test practice: evaluate on sequences kept out of training).
The Annotated Transformer's copy task (``data_gen``) and seed 001 (``generate_data``) draw their
evaluation data from the same distribution as their training batches, so evaluation sequences
also occur in training: with that scheme, at the quick preset 397 of the 1000 evaluation
sequences occurred verbatim in seed 0's training stream (every sequence of content length 1-3,
86 of 111 of length 4). Here the space of sequences is split by a deterministic hash of the
content (:func:`split_class`): a sequence of content length >= :data:`MIN_HELDOUT_LENGTH` (2) is
*held out* iff its class is :data:`HELDOUT_CLASS`, about 1 in :data:`HELDOUT_K`, and every such
length has sequences on both sides. :func:`make_batch` (training) never returns a held-out
sequence and :func:`eval_set` returns only held-out ones, so the two are disjoint by
construction, for every seed; :func:`heldout_overlap` measures it. Training draws its rows as
before (content length 1..L uniform) and then their content by rejection (same generator), so it
is uniform over the training sequences of each length; evaluation draws lengths 2..L uniformly.

Content length 1 is never held out (a deliberate departure from "every length"): there are only
V - 3 such sequences (8 at the quick preset), training sees all of them in its first steps,
and a held-out one shares no (position, token) with any training sequence of its length, so the
model is never taught it. Measured with length 1 split like the others (quick preset, seed 0,
``run --variants all``): final exact-match 0.928 for 7 of the 11 built-in variants, i.e. all 72
length-1 rows failed and nothing else (``baseline``, checked per length: 1.000 at every length
2..10, and [5] -> [5, 5, END], [10] -> [10, 10, END]), 0.926-0.964 for three more, 1.000 for
``seed_004`` only.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..config import RunConfig

PAD, START, END = 0, 1, 2

#: About 1 in ``HELDOUT_K`` sequences is held out (fewer classes when the vocabulary has fewer
#: than ``HELDOUT_K`` content symbols, see :func:`heldout_classes`).
HELDOUT_K = 5
#: The hash class reserved for evaluation.
HELDOUT_CLASS = 0
#: Shortest content length that is split; shorter sequences are all training ones.
MIN_HELDOUT_LENGTH = 2
#: Polynomial hash of the content after its first token: modulus (the Mersenne prime 2^31 - 1)
#: and base.
HASH_MOD = 2**31 - 1
HASH_BASE = 1_000_003
#: Contents a row draws per round, for the training side (which accepts about 4 in 5 draws) and
#: the held-out side (about 1 in 5).
TRAIN_TRIES = 4
HELDOUT_TRIES = 16
#: Redraw rounds before giving up (never reached: a draw lands on the wanted side with
#: probability at least 1 / (2 * HELDOUT_K - 1), see :func:`split_class`).
MAX_ROUNDS = 1000


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


def _symbols(task: str) -> int:
    """Lowest content token id of ``task`` (content ids run from it to V - 1)."""
    if task == "copy":
        return 3
    if task == "copy_fixed":
        return 1
    raise ValueError(f"unknown task {task!r}")


def heldout_classes(task: str, seq_len: int, vocab: int) -> int:
    """Number of hash classes K of the split: ``min(HELDOUT_K, S)`` for S content symbols
    (``copy``: V - 3; ``copy_fixed``: V - 1).

    With K <= S, the first content token alone runs through every class (see
    :func:`split_class`), so every content length >= :data:`MIN_HELDOUT_LENGTH` has both
    held-out and training sequences.

    Raises:
        ValueError: unknown ``task``.
        ConfigError: no split exists: ``copy`` with V = 4 (one sequence per length) or L = 1
            (content length 1 only), ``copy_fixed`` with L < 3 (content length L - 1 < 2).
    """
    symbols = vocab - _symbols(task)
    if symbols < 2:
        raise ConfigError(f"the {task} task needs vocab >= {_symbols(task) + 2} for a held-out split "
                          f"disjoint from training (two content symbols), got vocab={vocab}")
    longest = seq_len if task == "copy" else seq_len - 1  # content length (copy_fixed: after the start id)
    if longest < MIN_HELDOUT_LENGTH:
        need = MIN_HELDOUT_LENGTH + (task == "copy_fixed")
        raise ConfigError(f"the {task} task needs seq_len >= {need} for a held-out split (content of "
                          f"length >= {MIN_HELDOUT_LENGTH}; shorter content is never held out), got seq_len={seq_len}")
    return min(HELDOUT_K, symbols)


def eval_lengths(task: str, seq_len: int) -> tuple[int, int]:
    """(shortest, longest) content length of the held-out sequences: (2, L) for ``copy``,
    (L - 1, L - 1) for ``copy_fixed``."""
    return (MIN_HELDOUT_LENGTH, seq_len) if task == "copy" else (seq_len - 1, seq_len - 1)


@functools.lru_cache(maxsize=None)
def _powers(n: int) -> torch.Tensor:
    """(n,) int64: HASH_BASE^(i+1) mod HASH_MOD for i = 0..n-1."""
    return torch.tensor([pow(HASH_BASE, i + 1, HASH_MOD) for i in range(n)], dtype=torch.int64)


def split_class(task: str, src: torch.Tensor, vocab: int) -> torch.Tensor:
    """Hash class of every sequence: ``(x_1 + H(x_2..)) mod K``; a sequence is held out iff its
    class is :data:`HELDOUT_CLASS` and its content length is >= :data:`MIN_HELDOUT_LENGTH`
    (:func:`is_heldout`).

    ``x_1`` is the first content token (``src[:, 0]`` for ``copy``, ``src[:, 1]`` for
    ``copy_fixed``), ``H`` the polynomial hash ``(x_2 * b + x_3 * b^2 + ...) mod M`` of the rest
    of the row (pads included, as 0; b = :data:`HASH_BASE`, M = :data:`HASH_MOD`) and K =
    :func:`heldout_classes`. The first token enters unhashed so that, for any rest, the S >= K
    consecutive ids it can take cover every class: each (length >= 2, rest) has between floor(S/K) and ceil(S/K) held-out first tokens and the
    others are training ones (quick preset, S = 8, K = 5: 1 or 2 of 8; held out overall: 1 in 5).

    Args:
        task: ``copy`` or ``copy_fixed``.
        src: (B, S) int64 source rows as :func:`make_batch` returns them.
        vocab: vocabulary size V.

    Shape:
        src (B, S) -> (B,) int64 in [0, K).
    """
    k = heldout_classes(task, src.size(1), vocab)
    return _classes(src, 0 if task == "copy" else 1, k)


def _classes(rows: torch.Tensor, lead: int, k: int) -> torch.Tensor:
    """:func:`split_class` of rows whose first content token is at index ``lead`` of the last
    dim (trailing zeros do not change the hash). Shape: (..., S) -> (...,)."""
    rest = rows[..., lead + 1:]  # (..., S - lead - 1)
    h = (rest @ _powers(rest.size(-1))).remainder_(HASH_MOD)  # (...,)
    return h.add_(rows[..., lead]).remainder_(k)


def is_heldout(task: str, src: torch.Tensor, vocab: int) -> torch.Tensor:
    """(B,) bool: which rows of ``src`` (B, S) belong to the held-out split (class
    :data:`HELDOUT_CLASS` and content length >= :data:`MIN_HELDOUT_LENGTH`)."""
    held = split_class(task, src, vocab) == HELDOUT_CLASS
    if task == "copy":
        held &= src[:, MIN_HELDOUT_LENGTH - 1] != PAD
    return held


def _draw(task: str, rows: int, seq_len: int, vocab: int, generator: torch.Generator,
          heldout: bool) -> Batch:
    """A batch whose rows all lie on one side of the split, by rejection.

    Every row draws its content length (``copy``: 1..L for training, 2..L held out; length-1 rows
    are always training ones) and then ``tries`` contents of that length at
    once (:data:`TRAIN_TRIES` / :data:`HELDOUT_TRIES`) and keeps the first one on the wanted side;
    the rare rows with none (at the presets, 1 training batch in 6-9 has one) draw
    ``tries`` more, until no row is left. Which try is kept depends only on which tries are
    acceptable, so each row is uniform over that side's sequences of its length.
    """
    k = heldout_classes(task, seq_len, vocab)  # raises when no split exists
    tries = HELDOUT_TRIES if heldout else TRAIN_TRIES
    if task == "copy":  # rows in the layout [1, content, pad...] of width L + 2, content at 1..L
        width, low, lead = seq_len + 2, 3, 1
        shortest = MIN_HELDOUT_LENGTH if heldout else 1
        length = torch.randint(shortest, seq_len + 1, (rows, 1), generator=generator)  # (B, 1) content length
        pad = torch.arange(width) > length  # (B, L+2) True after the content
        short = None if heldout else length < MIN_HELDOUT_LENGTH  # (B, 1) never held out
    else:  # rows [1, content] of width L, content at 1..L-1
        width, low, lead = seq_len, 1, 1
    data = None  # (B, width) the accepted rows
    todo = None  # (R,) indices of rows still to draw (None: all)
    for _ in range(MAX_ROUNDS):
        n = rows if todo is None else todo.numel()
        new = torch.randint(low, vocab, (n, tries, width), generator=generator)  # (R, tries, width)
        if task == "copy":
            new.masked_fill_((pad if todo is None else pad[todo]).unsqueeze(1), PAD)
        new[..., 0] = START
        cls = _classes(new, lead, k)  # (R, tries)
        ok = cls.eq(HELDOUT_CLASS) if heldout else cls.ne(HELDOUT_CLASS)  # (R, tries)
        if task == "copy" and todo is None and not heldout:
            ok |= short  # (R, tries); later rounds hold no length-1 row (accepted in the first)
        found, first = ok.max(1)  # (R,), (R,)
        pick = new[torch.arange(n), first]  # (R, width) first acceptable try
        if todo is None:
            data = pick
        else:
            data[todo] = pick
        if bool(found.all()):
            break
        todo = (~found).nonzero().squeeze(1) if todo is None else todo[~found]
    else:
        raise RuntimeError(f"rows still on the wrong side of the split after {MAX_ROUNDS} rounds "
                           f"(task={task}, seq_len={seq_len}, vocab={vocab})")
    if task == "copy":
        src = data[:, 1:-1].clone()  # (B, L)
        data.scatter_(1, length + 1, END)
        return Batch(src, data[:, :-1].clone(), data[:, 1:].clone())
    return Batch(data, data[:, :-1].clone(), data[:, 1:].clone())


def make_batch(task: str, batch: int, seq_len: int, vocab: int, generator: torch.Generator) -> Batch:
    """Draw one training batch of the copy task on the CPU; never a held-out sequence.

    The layout is in the module docstring; rows are uniform over the training split of their
    content length (the split: :func:`split_class`). Deterministic given the generator's state.

    Args:
        task: ``copy`` or ``copy_fixed``.
        batch: rows B.
        seq_len: longest content length L (``copy``) or row length (``copy_fixed``).
        vocab: vocabulary size V.
        generator: the CPU generator the rows are drawn from (advanced in place).

    Shape:
        ``copy``: src (B, L), tgt and tgt_y (B, L+1). ``copy_fixed``: src (B, L), tgt and tgt_y
        (B, L-1).

    Raises:
        ValueError: unknown ``task``.
        ConfigError: no held-out split exists for ``vocab`` / ``seq_len`` (:func:`heldout_classes`).
    """
    return _draw(task, batch, seq_len, vocab, generator, heldout=False)


def eval_set(task: str, n: int, seq_len: int, vocab: int, seed: int) -> Batch:
    """The fixed held-out set: ``n`` held-out sequences drawn from ``seed`` (shared by every trial).

    Content lengths are uniform over :func:`eval_lengths` (``copy``: 2..L; length 1 is never held
    out, see the module docstring); the content is uniform over the held-out sequences of that
    length, none of which :func:`make_batch` ever returns. Sequences may repeat within the set
    (13 of the 64 length-2 sequences are held out at the quick preset).

    Shape:
        as :func:`make_batch` with B = n.

    Raises:
        as :func:`make_batch`.
    """
    return _draw(task, n, seq_len, vocab, torch.Generator().manual_seed(seed), heldout=True)


def count_overlap(eval_src: torch.Tensor, train_src) -> int:
    """Rows of ``eval_src`` (N, S) that occur verbatim among the rows of ``train_src``.

    Args:
        eval_src: (N, S) evaluation source rows (each repeat counts).
        train_src: (M, S) training source rows, or an iterable of (B_i, S) chunks.

    Returns:
        the number of evaluation rows, in 0..N, equal to some training row.
    """
    chunks = [train_src] if isinstance(train_src, torch.Tensor) else train_src
    seen: set[bytes] = set()
    for chunk in chunks:
        seen.update(row.tobytes() for row in chunk.contiguous().numpy())
    return sum(row.tobytes() in seen for row in eval_src.contiguous().numpy())


def training_sources(cfg: "RunConfig", seed: int):
    """The source rows of ``seed``'s training stream, batch by batch: what
    :func:`harness.train.train` draws (``steps`` batches from ``Generator().manual_seed(seed)``).

    Yields:
        ``cfg.train.steps`` tensors of shape (B, L), B = ``cfg.train.batch``.
    """
    tc = cfg.train
    generator = torch.Generator().manual_seed(seed)
    for _ in range(tc.steps):
        yield make_batch(tc.task, tc.batch, tc.seq_len, cfg.model.vocab, generator).src


def heldout_overlap(cfg: "RunConfig", seed: int) -> tuple[int, int]:
    """Measured overlap of the final evaluation set with a seed's training stream.

    Counts the ``eval_sequences`` sequences of ``eval_set(..., eval_seed)`` that occur verbatim
    among the first ``steps x batch`` training sequences of ``seed`` (0 by construction; the
    pre-split code gave 397/1000 at the quick preset, seed 0). Costs one pass of batch
    generation, no model (about 0.4 s at the quick preset on a 2-core CPU).

    Returns:
        ``(overlap, n)``: overlapping evaluation sequences (each repeat counts) and n =
        ``eval_sequences``.
    """
    tc = cfg.train
    data = eval_set(tc.task, tc.eval_sequences, tc.seq_len, cfg.model.vocab, tc.eval_seed)
    return count_overlap(data.src, training_sources(cfg, seed)), data.src.size(0)


def heldout_note(cfg: "RunConfig", seed: int) -> str:
    """One line for a report: the split and the measured overlap, e.g. ``evaluation set: 1000
    sequences of content length 2-10, disjoint from training by construction (hash split, 1 in 5
    held out); measured overlap with seed 0's training stream: 0/1000``."""
    tc = cfg.train
    overlap, n = heldout_overlap(cfg, seed)
    k = heldout_classes(tc.task, tc.seq_len, cfg.model.vocab)
    low, high = eval_lengths(tc.task, tc.seq_len)
    span = f"{low}-{high}" if low < high else f"{low}"
    return (f"evaluation set: {n} sequences of content length {span}, disjoint from training by "
            f"construction (hash split, 1 in {k} held out); measured overlap with seed {seed}'s "
            f"training stream: {overlap}/{n}")


@torch.no_grad()
def greedy_decode(model, src: torch.Tensor, steps: int, start: int = START) -> torch.Tensor:
    """Greedy decoding (Annotated ``greedy_decode``), batched.

    Args:
        model: an :class:`harness.model.EncoderDecoder` (put it in eval mode first).
        src: (B, S) source ids.
        steps: tokens to generate.
        start: the start symbol fed first (1; seed 001 used 0, the pad id -- fixed).

    Returns:
        (B, steps) predicted ids (the start symbol is not included).
    """
    pad = model.cfg.pad
    src_mask = model.mask_style.src_mask(src, pad)
    memory = model.encode(src, src_mask)
    ys = torch.full((src.size(0), 1), start, dtype=src.dtype, device=src.device)
    for _ in range(steps):
        tgt_mask = model.mask_style.tgt_mask(ys, pad)
        out = model.decode(memory, src_mask, ys, tgt_mask)  # (B, t, D)
        next_word = model.embed.logits(out[:, -1]).argmax(dim=-1, keepdim=True)  # (B, 1)
        ys = torch.cat([ys, next_word.to(ys.dtype)], dim=1)
    return ys[:, 1:]


def exact_match(pred: torch.Tensor, tgt_y: torch.Tensor, pad: int = PAD) -> torch.Tensor:
    """Per-sequence exact match: every non-pad label (content and end symbol) predicted.

    Shape: pred, tgt_y (B, T) -> (B,) bool.
    """
    keep = tgt_y != pad
    return ((pred == tgt_y) | ~keep).all(dim=1)
