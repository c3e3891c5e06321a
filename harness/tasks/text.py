"""``text``: a character-level causal language model on Tiny Shakespeare (real data), or on a text of one's own.

The model reads characters and predicts the next one, as Karpathy's char-rnn and nanoGPT's ``shakespeare_char``
do. Its held-out cross-entropy (nats per character) is nanoGPT's "val loss"; ``bpc`` is the same number in bits
per character (CE / ln 2), the unit of the compression literature (Shannon 1951).

Decisions (``docs/tasks.md`` states them for readers):

* **Corpus**: Tiny Shakespeare, ``data/tinyshakespeare/input.txt`` of karpathy/char-rnn (1,115,394 characters,
  65 distinct), committed gzip'd under ``harness/tasks/data/tinyshakespeare/`` (its README.md: source, licence,
  checksums) and checked against :data:`CORPUS_SHA256` when read. ``task.path=FILE`` reads a UTF-8 file instead.
  Read on first use, once per process (per file version), never at import.
* **Vocabulary**: the sorted distinct characters of the corpus, ids ``3 .. 3 + n - 1`` (0 pad, 1 start, 2 end
  stay reserved): V = 68 for Tiny Shakespeare. :meth:`TextTask.fit` sets ``model.vocab`` to it unless given.
* **Split by position**, as nanoGPT's ``data/shakespeare_char/prepare.py``: the first ``int(0.9 N)`` characters
  are the training part, the rest the test region (nanoGPT's "val"); the last 1/:data:`DEV_DIVISOR` of the
  training part is the dev slice, never drawn for training. Tiny Shakespeare: 953,662 training, 50,192 dev,
  111,540 test characters (:func:`split_regions`).
* **Rows**: a window of C + 1 characters ``w_0 .. w_C`` (C = ``train.seq_len``) gives ``src = [w_0]`` (S = 1),
  ``tgt = [START, w_1, ..., w_{C-1}]`` and ``tgt_y = [w_1, ..., w_C]`` (T = C, no end symbol): label ``w_i``
  has the context ``w_0 .. w_{i-1}``, 1 to C characters, nanoGPT's block of C. A decoder-only model packs
  source and target into one sequence; an encoder-decoder's encoder sees ``w_0`` only.
* **Training** windows start uniformly at random in the training region and lie inside it.
* **Evaluation**: windows spaced evenly over the test region (the dev slice for the dev set), at a stride of
  at least C so no character is scored twice; the seed sets their phase (:func:`spaced_starts`). At most
  ``(length - 1) // C`` windows, which then score every character of the region but its first.
"""
from __future__ import annotations

import copy
import functools
import gzip
import hashlib
import math
import os
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Iterator

import torch
from torch.nn import functional as F

from ..errors import ConfigError
from ..metrics import TEXT_METRICS
from .base import PAD, START, Batch, Task, evaluate as prefix_evaluate

if TYPE_CHECKING:
    from ..config import RunConfig

CORPUS_NAME = "Tiny Shakespeare"
CORPUS_FILE = ("data", "tinyshakespeare", "input.txt.gz")  #: under this package
CORPUS_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"  #: of the uncompressed text
TRAIN_FRACTION = 0.9  #: nanoGPT's split: the first int(0.9 N) characters train, the rest validate (our test)
DEV_DIVISOR = 20  #: the dev slice: the last 1/20 of the training part (integer division)
LOW = 3  #: id of the first character (0 pad, 1 start, 2 end)


@dataclass(frozen=True)
class Corpus:
    """A text as ids.

    Attributes:
        name: where it comes from, for messages and notes: ``Tiny Shakespeare`` or ``task.path='FILE'``.
        chars: the vocabulary, the sorted distinct characters: ``chars[i]`` has id ``LOW + i``.
        ids: (N,) int64, the text's character ids.
        sha256: SHA-256 of the text's UTF-8 bytes.
    """

    name: str
    chars: str
    ids: torch.Tensor
    sha256: str

    @property
    def vocab(self) -> int:
        """The ``model.vocab`` it needs: 3 reserved ids + its characters."""
        return LOW + len(self.chars)

    def regions(self) -> dict[str, tuple[int, int]]:
        """``{"train", "dev", "test"}`` -> [start, end) character positions (:func:`split_regions`)."""
        return split_regions(self.ids.numel())


def split_regions(n: int) -> dict[str, tuple[int, int]]:
    """[start, end) positions of the three regions of an ``n``-character text: test = the last ``n - int(0.9 n)``
    (nanoGPT's validation split), dev = the last ``int(0.9 n) // 20`` of the rest, train = what precedes it."""
    part = int(n * TRAIN_FRACTION)
    dev = part // DEV_DIVISOR
    return {"train": (0, part - dev), "dev": (part - dev, part), "test": (part, n)}


@functools.lru_cache(maxsize=None)
def min_chars(seq_len: int) -> int:
    """The shortest text whose three regions each hold a window of ``seq_len + 1`` characters."""
    n = max(1, int((seq_len + 1) * DEV_DIVISOR / TRAIN_FRACTION) - DEV_DIVISOR)
    while min(hi - lo for lo, hi in split_regions(n).values()) < seq_len + 1:
        n += 1
    return n


def as_corpus(name: str, text: str, sha256: str) -> Corpus:
    """``text`` as a :class:`Corpus` (ids by the sorted distinct characters)."""
    chars = "".join(sorted(set(text)))
    if not text:
        return Corpus(name, chars, torch.zeros(0, dtype=torch.long), sha256)
    points = torch.frombuffer(bytearray(text.encode("utf-32-le")), dtype=torch.int32).long()  # (N,) code points
    table = torch.tensor([ord(c) for c in chars], dtype=torch.long)
    return Corpus(name, chars, torch.searchsorted(table, points) + LOW, sha256)


@functools.lru_cache(maxsize=1)
def shakespeare() -> Corpus:
    """Tiny Shakespeare from the package, read once per process.

    Raises:
        RuntimeError: the packaged file is missing, damaged or not the text :data:`CORPUS_SHA256` names.
    """
    path = resources.files(__package__).joinpath(*CORPUS_FILE)
    try:
        raw = gzip.decompress(path.read_bytes())
    except (OSError, EOFError) as e:
        raise RuntimeError(f"{CORPUS_NAME} ({'/'.join(CORPUS_FILE)}) cannot be read from the installed package: "
                           f"{e}") from e
    digest = hashlib.sha256(raw).hexdigest()
    if digest != CORPUS_SHA256:
        raise RuntimeError(f"{CORPUS_NAME} in the installed package has SHA-256 {digest}, not {CORPUS_SHA256}: "
                           f"a damaged install (harness/tasks/data/tinyshakespeare/README.md)")
    return as_corpus(CORPUS_NAME, raw.decode("utf-8"), digest)


@functools.lru_cache(maxsize=4)
def _read_file(path: str, size: int, mtime_ns: int) -> Corpus:
    """The UTF-8 file ``path`` as a :class:`Corpus` (``size`` and ``mtime_ns`` key the cache: an edited file
    is read again)."""
    name = f"task.path={path!r}"
    try:
        raw = open(path, "rb").read()
        text = raw.decode("utf-8")
    except OSError as e:
        raise ConfigError(f"{name}: cannot read it ({e.strerror or e}); the text task reads a UTF-8 text "
                          f"file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{name} is not UTF-8 text (byte {e.start}: {e.reason}); the text task reads UTF-8 "
                          f"files") from None
    return as_corpus(name, text, hashlib.sha256(raw).hexdigest())


def corpus(path: str = "") -> Corpus:
    """The text the task reads: Tiny Shakespeare (``path`` empty) or the UTF-8 file ``path`` (``task.path``).

    Raises:
        ConfigError: ``path`` cannot be read or is not UTF-8 text (one line naming the file).
    """
    if not path:
        return shakespeare()
    try:
        st = os.stat(path)
    except OSError as e:
        raise ConfigError(f"task.path={path!r}: cannot read it ({e.strerror or e}); the text task reads a UTF-8 "
                          f"text file") from None
    return _read_file(path, st.st_size, st.st_mtime_ns)


def window_batch(windows: torch.Tensor) -> Batch:
    """Windows of C + 1 characters as rows: ``src = [w_0]``, ``tgt = [START, w_1 .. w_{C-1}]``,
    ``tgt_y = [w_1 .. w_C]``.

    Shape: windows (B, C + 1) -> src (B, 1), tgt and tgt_y (B, C)."""
    start = torch.full_like(windows[:, :1], START)
    return Batch(windows[:, :1].clone(), torch.cat([start, windows[:, 1:-1]], dim=1), windows[:, 1:].clone())


def spaced_starts(length: int, n: int, seq_len: int, seed: int) -> torch.Tensor:
    """Start offsets of ``n`` windows of ``seq_len + 1`` characters spaced evenly over a region of ``length``:
    at most ``(length - 1) // seq_len`` windows, at a stride of ``(length - 1) // n`` >= ``seq_len`` (no label
    position twice), shifted by ``seed`` modulo the room left, so every window lies inside the region.

    Shape: -> (n',) int64, n' = min(n, (length - 1) // seq_len)."""
    n = min(n, (length - 1) // seq_len)
    if n <= 0:
        return torch.zeros(0, dtype=torch.long)
    stride = (length - 1) // n
    room = length - 1 - seq_len - (n - 1) * stride  # >= 0 as stride >= seq_len
    return seed % (room + 1) + stride * torch.arange(n)


class TextTask(Task):
    """``text``: next-character prediction on Tiny Shakespeare or ``task.path`` (module docstring).

    Rows: ``src`` (B, 1) the window's first character, ``tgt`` (B, C) ``[1, w_1 .. w_{C-1}]``, ``tgt_y`` (B, C)
    ``[w_1 .. w_C]``, C = ``train.seq_len``. Scores: held-out CE (nats per character) and token accuracy from
    prefix-only forwards (:func:`harness.tasks.base.evaluate`) and ``bpc`` = CE / ln 2; exact match of a whole
    window is computed by the shared evaluation but is not one of its metrics. :attr:`path` is the file it
    reads: a task from :meth:`for_config` holds its config's; the shared instance reads Tiny Shakespeare.
    """

    name = "text"
    summary = "character-level language model: the next character of Tiny Shakespeare (or task.path's file)"
    source = ("Tiny Shakespeare (karpathy/char-rnn data/tinyshakespeare/input.txt); nanoGPT shakespeare_char "
              "(Karpathy); char-rnn")
    metrics = TEXT_METRICS
    primary_metric = "heldout_ce"
    reads_path = True
    path = ""  #: the ``task.path`` this instance reads ("" : Tiny Shakespeare)

    def for_config(self, cfg: "RunConfig") -> "TextTask":
        """This task reading ``cfg``'s ``task.path`` (itself when it already does)."""
        if cfg.task.path == self.path:
            return self
        bound = copy.copy(self)
        bound.path = cfg.task.path
        return bound

    def corpus(self) -> Corpus:
        """The text of :attr:`path` (:func:`corpus`). Raises: ConfigError: the file cannot be read."""
        return corpus(self.path)

    def _rows(self, region: str, starts: torch.Tensor, seq_len: int) -> torch.Tensor:
        """Windows of ``seq_len + 1`` characters at ``starts`` (offsets into ``region``). Shape: (B,) -> (B, C + 1)."""
        c = self.corpus()
        lo = c.regions()[region][0]
        return c.ids[(lo + starts)[:, None] + torch.arange(seq_len + 1)]

    def _train_starts(self, seq_len: int) -> int:
        """How many windows of ``seq_len + 1`` characters fit in the training region (their starts: 0 .. that - 1)."""
        lo, hi = self.corpus().regions()["train"]
        return hi - lo - seq_len

    def make_batch(self, batch, seq_len, vocab, generator):
        """``batch`` windows of the training region, starts uniform (one ``torch.randint`` from ``generator``)."""
        self.check(seq_len, vocab)
        starts = torch.randint(self._train_starts(seq_len), (batch,), generator=generator)
        return window_batch(self._rows("train", starts, seq_len))

    def index_stream(self, cfg: "RunConfig", generator: torch.Generator) -> Iterator[torch.Tensor]:
        """:meth:`make_batch`'s draws as (B,) window starts (a trial group's fast path)."""
        tc = cfg.train
        self.check(tc.seq_len, cfg.model.vocab)
        count = self._train_starts(tc.seq_len)

        def draws() -> Iterator[torch.Tensor]:
            while True:
                yield torch.randint(count, (tc.batch,), generator=generator)
        return draws()

    def stack_indices(self, cfg, indices, fit):
        """K seeds' batches from their window starts in one gather, padded to ``fit``'s widths where it gives any.

        Shape: indices K x (B,) -> src (K, B, 1), tgt and tgt_y (K, B, C); label tokens K ints (B * C each)."""
        index = torch.stack(indices)  # (K, B)
        (k, b), c = index.shape, cfg.train.seq_len
        rows = window_batch(self._rows("train", index.flatten(), c))
        s, t = fit(1, c) or (1, c)
        out = tuple(F.pad(x, (0, w - x.size(1)), value=PAD).view(k, b, w)
                    for x, w in ((rows.src, s), (rows.tgt, t), (rows.tgt_y, t)))
        return out, [b * c] * k

    def overlap_rows(self, batch: Batch) -> torch.Tensor:
        """The whole windows ``[w_0 .. w_C]`` (the source alone is one character, shared by most windows):
        what the measured overlaps compare (:func:`harness.tasks.splits.overlap_rows`). Shape: (B, C + 1)."""
        return torch.cat([batch.src, batch.tgt_y], dim=1)

    def _spaced(self, region: str, n: int, seq_len: int, vocab: int, seed: int) -> Batch:
        self.check(seq_len, vocab)
        lo, hi = self.corpus().regions()[region]
        return window_batch(self._rows(region, spaced_starts(hi - lo, n, seq_len, seed), seq_len))

    def eval_set(self, n, seq_len, vocab, seed):
        """``n`` windows spaced evenly over the test region (:func:`spaced_starts`; fewer where they do not fit)."""
        return self._spaced("test", n, seq_len, vocab, seed)

    def dev_set(self, n, seq_len, vocab, seed, test_src):
        """``n`` windows spaced evenly over the dev slice, which training and the test set never reach (by
        position), so ``test_src`` is not needed."""
        return self._spaced("dev", n, seq_len, vocab, seed)

    def widths(self, seq_len):
        return 1, seq_len

    def fit(self, cfg: "RunConfig", given: set[str]) -> "RunConfig":
        """``model.vocab`` set to 3 + the corpus's characters (68 for Tiny Shakespeare) unless given."""
        need = self.corpus().vocab
        if "model.vocab" in given or cfg.model.vocab == need:
            return cfg
        return cfg.override({"model.vocab": need})

    def validate(self, cfg):
        super().validate(cfg)
        self.check(cfg.train.seq_len, cfg.model.vocab)

    def check(self, seq_len: int, vocab: int) -> None:
        """Raises: ConfigError: ``vocab`` below the corpus's, or a corpus too short for windows of ``seq_len + 1``."""
        c = self.corpus()
        if vocab < c.vocab:
            raise ConfigError(f"the text task reads {len(c.chars)} distinct characters in {c.name} (ids "
                              f"3..{c.vocab - 1}; 0 pad, 1 start, 2 end): it needs model.vocab >= {c.vocab}, got {vocab}")
        if c.ids.numel() < min_chars(seq_len):
            raise ConfigError(f"{c.name} holds {c.ids.numel():,} characters; the text task at train.seq_len={seq_len} "
                              f"needs at least {min_chars(seq_len):,}: its train, dev (the last 1/{DEV_DIVISOR} of the "
                              f"first 90 %) and test (the last 10 %) regions must each hold a window of {seq_len + 1} "
                              f"characters")

    def _where(self, region: str) -> str:
        c = self.corpus()
        lo, hi = c.regions()[region]
        return f"the {hi - lo:,} characters of {c.name} from position {lo:,}"

    def split_note(self, seq_len, vocab):
        return (f"windows of {seq_len + 1} characters spaced evenly over the test region ({self._where('test')}: the "
                f"last 10 %, nanoGPT's validation split; text SHA-256 {self.corpus().sha256[:12]}), each scoring its "
                f"last {seq_len}, none twice; disjoint from training ({self._where('train')}) and dev by position")

    def dev_note(self, seq_len, vocab):
        return (f"windows of {seq_len + 1} characters spaced evenly over the dev slice ({self._where('dev')}: the last "
                f"1/{DEV_DIVISOR} of the first 90 %, never drawn for training), disjoint from training and test by "
                f"position")

    def encode_input(self, text, cfg):
        """A text of the corpus's characters -> their ids (S,), the source ``python -m harness decode`` continues.

        Raises:
            ConfigError: an empty text, a character outside the vocabulary (named), or one longer than
                ``model.max_len``.
        """
        c = self.corpus()
        bad = sorted({ch for ch in text if ch not in c.chars})
        if not text or bad:
            raise ConfigError(f"the text task reads the {len(c.chars)} characters of {c.name}, got {text!r}"
                              + (f" (not among them: {''.join(bad)!r})" if bad else ""))
        if len(text) > cfg.model.max_len:
            raise ConfigError(f"{text!r} is {len(text)} characters long; the model takes at most model.max_len = "
                              f"{cfg.model.max_len}")
        return tuple(LOW + c.chars.index(ch) for ch in text)

    def decode_output(self, ids, cfg):
        """Character ids -> the text; an id that is no character is written ``<id>``."""
        chars = self.corpus().chars
        return "".join(chars[i - LOW] if LOW <= i < LOW + len(chars) else f"<{i}>" for i in ids)

    def evaluate(self, model, data, cfg, device, dtype, chunk=None, causal=False):
        """The shared prefix-only scores (:func:`harness.tasks.base.evaluate`) plus ``bpc`` (:func:`with_bpc`)."""
        return with_bpc(prefix_evaluate(model, data, cfg, device, dtype, chunk=chunk))


def with_bpc(scores: dict[str, float]) -> dict[str, float]:
    """``scores`` with ``bpc`` = ``heldout_ce`` / ln 2: bits per character (a character is a token here)."""
    return {**scores, "bpc": scores["heldout_ce"] / math.log(2)}
