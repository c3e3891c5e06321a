"""The copy tasks: the model must reproduce its source sequence (:class:`CopyTask`,
:class:`CopyFixedTask`, :class:`CopyLengthTask`), and the held-out hash split that ``reverse`` and
``sort`` (:mod:`harness.tasks.algorithmic`) and plugins share through :class:`HashSplitTask`.
The module-level functions (``make_batch(task, ...)``, ``eval_set(task, ...)``, ...) take a task
name and call the registered task.

Two versions of copy with the hash split (``TrainConfig.task``); ``copy_length`` is in
:class:`CopyLengthTask`:

* ``copy`` -- note 001's ``generate_data``: vocabulary V with 0 = pad, 1 = start, 2 = end;
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
The Annotated Transformer's copy task (``data_gen``) and note 001 (``generate_data``) draw their
evaluation data from the same distribution as their training batches, so evaluation sequences
also occur in training: with that scheme, at the quick preset 397 of the 1000 evaluation
sequences occurred verbatim in seed 0's training stream (every sequence of content length 1-3,
86 of 111 of length 4). Here the space of sequences is split by a deterministic hash of the
content (:func:`split_class`): a sequence of content length >= :data:`MIN_HELDOUT_LENGTH` (2) is
*held out* iff its class is :data:`HELDOUT_CLASS`, about 1 in :data:`HELDOUT_K`, and every such
length has sequences on both sides. :meth:`HashSplitTask.make_batch` (training) never returns a
held-out sequence and :meth:`HashSplitTask.eval_set` returns only held-out ones, so the two are
disjoint by construction, for every seed; :func:`harness.tasks.base.heldout_overlap` measures it. Training draws its rows as
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

import torch

from ..errors import ConfigError
from .base import END, PAD, START, Batch, Task

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

#: Lowest content id of the padded layout (``copy``, ``reverse``, ``sort``, ``copy_length``) and of
#: the fixed layout (``copy_fixed``: start and end ids may occur as content, as in the Annotated code).
PADDED_LOW, FIXED_LOW = 3, 1


def _low(task: str) -> int:
    """Lowest content token id of a hash-split task given by name (legacy helpers below)."""
    if task in ("copy", "reverse", "sort"):
        return PADDED_LOW
    if task == "copy_fixed":
        return FIXED_LOW
    raise ValueError(f"unknown task {task!r} (hash-split tasks: copy, copy_fixed, reverse, sort)")


def _classes_k(task_name: str, low: int, seq_len: int, vocab: int, fixed: bool) -> int:
    """:func:`heldout_classes` for a layout (``low``: lowest content id; ``fixed``: copy_fixed's)."""
    symbols = vocab - low
    if symbols < 2:
        raise ConfigError(f"the {task_name} task needs vocab >= {low + 2} for a held-out split "
                          f"disjoint from training (two content symbols), got vocab={vocab}")
    longest = seq_len - 1 if fixed else seq_len  # content length (copy_fixed: after the start id)
    if longest < MIN_HELDOUT_LENGTH:
        need = MIN_HELDOUT_LENGTH + fixed
        raise ConfigError(f"the {task_name} task needs seq_len >= {need} for a held-out split (content of "
                          f"length >= {MIN_HELDOUT_LENGTH}; shorter content is never held out), got seq_len={seq_len}")
    return min(HELDOUT_K, symbols)


def heldout_classes(task: str, seq_len: int, vocab: int) -> int:
    """Number of hash classes K of the split: ``min(HELDOUT_K, S)`` for S content symbols
    (``copy``, ``reverse``, ``sort``: V - 3; ``copy_fixed``: V - 1).

    With K <= S, the first content token alone runs through every class (see
    :func:`split_class`), so every content length >= :data:`MIN_HELDOUT_LENGTH` has both
    held-out and training sequences.

    Raises:
        ValueError: unknown ``task``.
        ConfigError: no split exists: ``copy`` with V = 4 (one sequence per length) or L = 1
            (content length 1 only), ``copy_fixed`` with L < 3 (content length L - 1 < 2).
    """
    return _classes_k(task, _low(task), seq_len, vocab, task == "copy_fixed")


def eval_lengths(task: str, seq_len: int) -> tuple[int, int]:
    """(shortest, longest) content length of the held-out sequences: (2, L) for ``copy``,
    ``reverse`` and ``sort``, (L - 1, L - 1) for ``copy_fixed``."""
    return (seq_len - 1, seq_len - 1) if task == "copy_fixed" else (MIN_HELDOUT_LENGTH, seq_len)


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
    ``reverse`` and ``sort`` split their source exactly as ``copy`` does.

    Args:
        task: ``copy``, ``copy_fixed``, ``reverse`` or ``sort``.
        src: (B, S) int64 source rows as :meth:`HashSplitTask.make_batch` returns them.
        vocab: vocabulary size V.

    Shape:
        src (B, S) -> (B,) int64 in [0, K).
    """
    k = heldout_classes(task, src.size(1), vocab)
    return _classes(src, 1 if task == "copy_fixed" else 0, k)


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
    if task != "copy_fixed":
        held &= src[:, MIN_HELDOUT_LENGTH - 1] != PAD
    return held


def _draw_padded(rows: int, lengths: tuple[int, int], vocab: int, generator: torch.Generator,
                 side: str, k: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``[1, content, pad...]`` of the padded layout whose content all lies on one side of the
    split, by rejection.

    Every row draws its content length uniformly from ``lengths`` and then ``tries`` contents of
    that length at once (:data:`TRAIN_TRIES` / :data:`HELDOUT_TRIES`) and keeps the first one on
    the wanted side; the rare rows with none (at the presets, 1 training batch in 6-9 has one) draw
    ``tries`` more, until no row is left. Which try is kept depends only on which tries are
    acceptable, so each row is uniform over that side's sequences of its length. Rows shorter than
    :data:`MIN_HELDOUT_LENGTH` are always training ones.

    Args:
        lengths: (shortest, longest) content length; the rows are ``longest + 2`` wide.
        side: ``"train"``, ``"heldout"``, or ``"all"`` (no split: one draw, ``k`` unused).
        k: hash classes (:func:`heldout_classes`).

    Returns:
        ``data`` (B, longest + 2) int64 and ``length`` (B, 1) content lengths.
    """
    shortest, longest = lengths
    width = longest + 2
    tries = {"train": TRAIN_TRIES, "heldout": HELDOUT_TRIES, "all": 1}[side]
    length = torch.randint(shortest, longest + 1, (rows, 1), generator=generator)  # (B, 1) content length
    pad = torch.arange(width) > length  # (B, L+2) True after the content
    short = length < MIN_HELDOUT_LENGTH if side == "train" else None  # (B, 1) never held out
    data = _rejection(rows, tries, width, PADDED_LOW, vocab, generator, side, k, pad, short)
    return data, length


def _rejection(rows, tries, width, low, vocab, generator, side, k, pad=None, short=None) -> torch.Tensor:
    """The rejection loop of :func:`_draw_padded` (``pad`` given) and of the fixed layout."""
    data = None  # (B, width) the accepted rows
    todo = None  # (R,) indices of rows still to draw (None: all)
    for _ in range(MAX_ROUNDS):
        n = rows if todo is None else todo.numel()
        new = torch.randint(low, vocab, (n, tries, width), generator=generator)  # (R, tries, width)
        if pad is not None:
            new.masked_fill_((pad if todo is None else pad[todo]).unsqueeze(1), PAD)
        new[..., 0] = START
        if side == "all":
            return new[:, 0]
        cls = _classes(new, 1, k)  # (R, tries)
        ok = cls.eq(HELDOUT_CLASS) if side == "heldout" else cls.ne(HELDOUT_CLASS)  # (R, tries)
        if short is not None and todo is None:
            ok |= short  # (R, tries); later rounds hold no length-1 row (accepted in the first)
        found, first = ok.max(1)  # (R,), (R,)
        pick = new[torch.arange(n), first]  # (R, width) first acceptable try
        if todo is None:
            data = pick
        else:
            data[todo] = pick
        if bool(found.all()):
            return data
        todo = (~found).nonzero().squeeze(1) if todo is None else todo[~found]
    raise RuntimeError(f"rows still on the wrong side of the split after {MAX_ROUNDS} rounds "
                       f"(width={width}, vocab={vocab})")


def _padded_batch(data: torch.Tensor, length: torch.Tensor, answer=None) -> Batch:
    """Source, decoder input and labels from rows ``[1, content, pad...]`` (B, W+2): ``src`` =
    the content (B, W), ``tgt_y`` = ``[answer, 2, pad...]``, ``tgt`` = ``[1, answer, pad...]``
    (B, W+1), where ``answer(src, length)`` (B, W) is the task's output (pads after the length;
    default: the content itself)."""
    src = data[:, 1:-1].clone()  # (B, W)
    if answer is not None:
        data[:, 1:-1] = answer(src, length)
    data.scatter_(1, length + 1, END)
    return Batch(src, data[:, :-1].clone(), data[:, 1:].clone())


class HashSplitTask(Task):
    """A task on the padded layout with the hash split of this module: content lengths 1..L
    (training) and 2..L (evaluation), content ids 3..V-1, ``src`` (B, L) = content then pad,
    ``tgt_y`` (B, L+1) = ``[answer, 2, pad...]``, ``tgt`` (B, L+1) = ``[1, answer, pad...]``.
    Subclasses (``reverse``, ``sort``, a plugin's task) set ``name``, ``summary``, ``source`` and
    define :meth:`answer` (default: the content itself, i.e. ``copy``): an answer as long as its
    source. The split is on the source (:func:`split_class`): no evaluation source occurs in
    training, for every seed.
    """

    def answer(self, src: torch.Tensor, length: torch.Tensor, vocab: int) -> torch.Tensor:
        """The output the model must produce for each source: ids in 3..V-1 up to the row's
        length, pad after it.

        Shape: src (B, W), length (B, 1) content lengths -> (B, W).
        """
        return src

    def _k(self, seq_len: int, vocab: int) -> int:
        return _classes_k(self.name, PADDED_LOW, seq_len, vocab, fixed=False)

    def make_batch(self, batch, seq_len, vocab, generator):
        k = self._k(seq_len, vocab)  # raises when no split exists
        data, length = _draw_padded(batch, (1, seq_len), vocab, generator, "train", k)
        return _padded_batch(data, length, lambda src, n: self.answer(src, n, vocab))

    def eval_set(self, n, seq_len, vocab, seed):
        k = self._k(seq_len, vocab)
        data, length = _draw_padded(n, (MIN_HELDOUT_LENGTH, seq_len), vocab,
                                    torch.Generator().manual_seed(seed), "heldout", k)
        return _padded_batch(data, length, lambda src, n: self.answer(src, n, vocab))

    def validate(self, cfg):
        super().validate(cfg)
        self._k(cfg.train.seq_len, cfg.model.vocab)

    def split_note(self, seq_len, vocab):
        k = self._k(seq_len, vocab)
        return (f"sequences of content length {MIN_HELDOUT_LENGTH}-{seq_len}, disjoint from training by "
                f"construction (hash split, 1 in {k} held out)")


class CopyTask(HashSplitTask):
    """``copy``: output the source (variable length, padded); note 001's ``generate_data`` with
    the held-out hash split of this module (layout in the module docstring)."""

    name = "copy"
    summary = "output the source; content length 1..L with padding, ids 3..V-1 (default task)"
    source = "note 001 generate_data (Annotated Transformer copy task, variable length); hash split"


class CopyFixedTask(Task):
    """``copy_fixed``: the Annotated Transformer's ``data_gen`` (§ "A First Example"): rows of L
    ids from 1..V-1 starting with 1, no padding; ``src`` (B, L), ``tgt``/``tgt_y`` (B, L-1).
    Held-out split as for ``copy`` on the content after the start id."""

    name = "copy_fixed"
    summary = "output the source; fixed length L, no padding, ids 1..V-1 (Annotated data_gen)"
    source = "Annotated Transformer, 'A First Example' data_gen; hash split"

    def _k(self, seq_len: int, vocab: int) -> int:
        return _classes_k(self.name, FIXED_LOW, seq_len, vocab, fixed=True)

    def _draw(self, rows, seq_len, vocab, generator, side) -> Batch:
        data = _rejection(rows, HELDOUT_TRIES if side == "heldout" else TRAIN_TRIES, seq_len, FIXED_LOW, vocab,
                          generator, side, self._k(seq_len, vocab))
        return Batch(data, data[:, :-1].clone(), data[:, 1:].clone())

    def make_batch(self, batch, seq_len, vocab, generator):
        return self._draw(batch, seq_len, vocab, generator, "train")

    def eval_set(self, n, seq_len, vocab, seed):
        return self._draw(n, seq_len, vocab, torch.Generator().manual_seed(seed), "heldout")

    def widths(self, seq_len):
        return seq_len, seq_len - 1

    def validate(self, cfg):
        super().validate(cfg)
        self._k(cfg.train.seq_len, cfg.model.vocab)

    def split_note(self, seq_len, vocab):
        k = self._k(seq_len, vocab)
        return (f"sequences of content length {seq_len - 1}, disjoint from training by construction "
                f"(hash split, 1 in {k} held out)")


class CopyLengthTask(Task):
    """``copy_length``: copy, trained on content lengths 1..L and evaluated on L+1..2L (quick
    preset: train 1-10, evaluate 11-20): length generalisation, where the positional encoding
    decides (Press et al. 2022, "Train Short, Test Long", ALiBi; Graves et al. 2014, Neural
    Turing Machines, copy with longer test sequences).

    Layout as ``copy`` (content ids 3..V-1, padding); training ``src`` (B, L), ``tgt``/``tgt_y``
    (B, L+1); evaluation ``src`` (n, 2L), ``tgt``/``tgt_y`` (n, 2L+1). The split is by length,
    so evaluation and training are disjoint by construction (no hash needed). Needs
    ``model.max_len >= 2L + 2``.
    """

    name = "copy_length"
    summary = "copy; train on content lengths 1..L, evaluate on L+1..2L (length generalisation)"
    source = "Graves et al. 2014 (NTM copy, longer test lengths); Press et al. 2022 (Train Short, Test Long)"

    def make_batch(self, batch, seq_len, vocab, generator):
        self._check_vocab(vocab)
        return _padded_batch(*_draw_padded(batch, (1, seq_len), vocab, generator, "all", None))

    def eval_set(self, n, seq_len, vocab, seed):
        self._check_vocab(vocab)
        gen = torch.Generator().manual_seed(seed)
        return _padded_batch(*_draw_padded(n, (seq_len + 1, 2 * seq_len), vocab, gen, "all", None))

    def _check_vocab(self, vocab: int) -> None:
        if vocab < PADDED_LOW + 1:
            raise ConfigError(f"the {self.name} task needs vocab >= {PADDED_LOW + 1} (one content symbol), got {vocab}")

    def widths(self, seq_len):
        return 2 * seq_len, 2 * seq_len + 1

    def validate(self, cfg):
        s, t = self.widths(cfg.train.seq_len)
        if cfg.model.max_len < t + 1:
            raise ConfigError(f"the {self.name} task evaluates on content lengths {cfg.train.seq_len + 1}-{s} "
                              f"(2 x train.seq_len={cfg.train.seq_len}): it needs model.max_len >= {t + 1} "
                              f"(2 x seq_len + 2), got model.max_len={cfg.model.max_len}")
        self._check_vocab(cfg.model.vocab)

    def split_note(self, seq_len, vocab):
        return (f"sequences of content length {seq_len + 1}-{2 * seq_len}, disjoint from training by "
                f"construction (training lengths 1-{seq_len})")


@torch.no_grad()
def greedy_decode(model, src: torch.Tensor, steps: int, start: int = START) -> torch.Tensor:
    """Greedy decoding (Annotated ``greedy_decode``), batched.

    Args:
        model: an :class:`harness.model.EncoderDecoder` (put it in eval mode first).
        src: (B, S) source ids.
        steps: tokens to generate.
        start: the start symbol fed first (1; note 001 used 0, the pad id -- fixed).

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
    """Per-sequence exact match: every non-pad label (content and end symbol) predicted
    (:meth:`harness.tasks.base.Task.score`).

    Shape: pred, tgt_y (B, T) -> (B,) bool.
    """
    return Task.score(pred, tgt_y, pad)
