"""The task interface: what a trial trains on and is scored on.

A *task* draws training batches, provides a held-out evaluation set that never overlaps the
training stream, and is scored by the exact match of greedy decoding (the metric that defines
"solved", see :data:`harness.train.SOLVED`). The scoring every task shares lives here, behind
:meth:`Task.evaluate`: the loss (:func:`loss_fn`) and the held-out cross-entropy, token accuracy
and exact match (:func:`evaluate`), all from prefix-only forwards (:func:`prefix_logits`): the
logits at a target position never come from a forward that holds a later target token, so a
decoder that leaks cannot score better than it predicts (:func:`future_leak` detects the leak).
Built-in tasks are registered by ``variants/tasks.py``
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
from torch.nn import functional as F

from ..env import autocast, prefix_pass
from ..errors import ConfigError
from ..metrics import COPY_METRICS, COPY_PRIMARY, Metric
from .prefix import prefix_logits_batched

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
    """Base class of every task (built-in or plugin). Subclass it, set the three class attributes and
    implement :meth:`make_batch` and :meth:`eval_set`; override the others when the defaults do not fit.

    Attributes:
        name: unique task name, used by ``--task NAME`` and stored in ``train.task``.
        summary: one line for ``list`` and reports: what the model must output.
        source: where the task comes from (paper section, tutorial, study note).
        plugin: set by the registry: the plugin that offered the task.
        metrics: what its trials are scored on (:class:`harness.metrics.Metric`), in the report's
            column order; default the copy-task metrics (:data:`harness.metrics.COPY_METRICS`). A
            task adding one returns its value under the metric's name from :meth:`evaluate`.
        primary_metric: the name of the metric its verdicts use unless ``--metric`` or the
            experiment says otherwise (one of ``metrics`` with ``verdict`` True).
        splits: the ``task.split`` values it offers, others refused (default ``("hash",)``; g2p adds ``standard``).
        reads_path: whether it reads ``task.path``, a file of the user's (``text``); False (default): refused.
        free_decoding: True when :meth:`evaluate` scores exact match by free-running decoding (the
            model fed only its own predictions, greedy or beam ``train.beam``, as g2p's WER does);
            False (default) when it comes from prefix-only forwards. The trial row says which
            (``exact_match_method``, and ``decoding`` when True).

    Scoring: a held-out sequence counts as solved when greedy decoding reproduces every non-pad label of
    ``tgt_y`` (:meth:`score`; every task's :func:`evaluate`), so a task defines what is right through its labels.
    """

    name: str = ""
    summary: str = ""
    source: str = ""
    plugin: str = ""
    metrics: tuple[Metric, ...] = COPY_METRICS
    primary_metric: str = COPY_PRIMARY
    free_decoding: bool = False
    splits: tuple[str, ...] = ("hash",)
    reads_path: bool = False

    def for_config(self, cfg: "RunConfig") -> "Task":
        """This task as ``cfg``'s ``task.*`` options set it; default itself (g2p: a copy reading ``task.split``)."""
        return self

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

    def batches(self, cfg: "RunConfig", generator: torch.Generator) -> Iterator[Batch]:
        """The training stream of a trial: batches drawn from ``generator`` (advanced in place).
        Default: :meth:`make_batch` with ``train.batch``, ``train.seq_len`` and ``model.vocab``,
        forever. Override to batch differently (``g2p``: length-bucketed with ``train.bucket``);
        the same rules hold: deterministic given the generator, never an evaluation sequence."""
        tc = cfg.train
        while True:
            yield self.make_batch(tc.batch, tc.seq_len, cfg.model.vocab, generator)

    def index_stream(self, cfg: "RunConfig", generator: torch.Generator) -> Iterator[torch.Tensor] | None:
        """Optional fast path of a trial group: the draws of :meth:`batches` from ``generator`` as
        index tensors, which :meth:`stack_indices` turns into K seeds' stacked batches in one
        gather -- the same tensors as stacking K :meth:`batches`. Default None: no fast path."""
        return None

    def stack_indices(self, cfg: "RunConfig", indices: list, fit) -> tuple[tuple, list[int]]:
        """``((src, tgt, tgt_y) (K, B, S|T), label tokens per seed)`` of :meth:`index_stream`'s
        draws; ``fit(s, t)`` gives the padded widths for the widest (s, t), or None to keep them."""
        raise NotImplementedError("stack_indices goes with index_stream")

    def fit(self, cfg: "RunConfig", given: set[str]) -> "RunConfig":
        """``cfg`` adjusted to what the task needs, for the keys the user did not set (``given``:
        the dotted keys of ``--set``, e.g. ``{"model.vocab"}``). Called when a run or bench resolves
        its config; default: ``cfg`` unchanged. :meth:`validate` still checks the result."""
        return cfg

    def eval_set(self, n: int, seq_len: int, vocab: int, seed: int) -> Batch:
        """The fixed held-out set: ``n`` sequences drawn from ``seed``, none of which
        :meth:`make_batch` ever returns (for any generator state).

        Shape:
            src (n, S), tgt and tgt_y (n, T).
        """
        raise NotImplementedError

    def dev_set(self, n: int, seq_len: int, vocab: int, seed: int, test_src: torch.Tensor) -> Batch:
        """The dev set: ``n`` sequences of the task's own dev stream ``seed``, none of which
        :meth:`make_batch` ever returns and none whose source is a row of ``test_src`` (the test
        set's sources: :meth:`eval_set` at ``train.eval_seed``, :func:`harness.tasks.splits.test_set`).
        The periodic evaluations, "solved" and every selection read it; the test set is scored once,
        after training (``docs/tasks.md``, "Splits").

        Default, from :meth:`eval_set` alone (a task written before dev splits existed has one):
        :meth:`eval_set` at seeds ``seed``, ``seed + DEV_STRIDE``, ... (at most :data:`DEV_ROUNDS`), keeping
        in order the rows whose source is no test source until ``n`` are kept (fewer where the test set
        nearly covers the evaluation space); they keep :meth:`eval_set`'s guarantee (never a training sequence).

        Shape:
            test_src (N, S) -> src (n', S'), tgt and tgt_y (n', T), n' <= n.

        Raises:
            ConfigError: no row outside the test set in :data:`DEV_ROUNDS` draws (an :meth:`eval_set`
                that ignores its seed: override this method).
        """
        avoid, kept, have = set(row_keys(test_src, test_src.size(1))), [], 0
        for r in range(DEV_ROUNDS if n else 0):
            b = self.eval_set(n, seq_len, vocab, seed + r * DEV_STRIDE)
            fresh = torch.tensor([k not in avoid for k in row_keys(b.src, test_src.size(1))], dtype=torch.bool)
            idx = fresh.nonzero().flatten()[:n - have]
            kept.append(Batch(b.src[idx], b.tgt[idx], b.tgt_y[idx]))
            have += idx.numel()
            if have == n:
                break
        if not have:
            raise ConfigError(f"the {self.name} task has no dev sequences: {DEV_ROUNDS} draws of its evaluation "
                              f"set (seeds {seed}, {seed + DEV_STRIDE}, ...) held only test sequences; at "
                              f"seq_len={seq_len}, vocab={vocab} the test set covers its held-out sequences (a larger "
                              "seq_len or vocab leaves room), or its eval_set ignores its seed (give it a dev_set: "
                              "docs/plugins.md)")
        return cat_batches(kept)

    def dev_note(self, seq_len: int, vocab: int) -> str:
        """How the dev set is kept apart, after "dev set: N" (the default :meth:`dev_set`'s way)."""
        return "sequences drawn like the test set from seeds of their own, none with a test source"

    def widths(self, seq_len: int) -> tuple[int, int]:
        """(S, T): the longest source and target rows of training batches and evaluation sets.
        Default (L, L + 1): content of length <= L, answer plus the end symbol."""
        return seq_len, seq_len + 1

    def validate(self, cfg: "RunConfig") -> None:
        """Raise :class:`harness.errors.ConfigError` when ``cfg`` cannot run this task (with the
        value it needs). Default: the positional encoding covers :meth:`widths` plus one
        position (``model.max_len >= max(S, T) + 1``), ``task.split`` is one of :attr:`splits`, ``task.path``
        is empty unless :attr:`reads_path`."""
        if cfg.task.split not in self.splits:
            raise ConfigError(f"the {self.name} task offers task.split={' or '.join(self.splits)}, "
                              f"got {cfg.task.split!r}")
        if cfg.task.path and not self.reads_path:
            raise ConfigError(f"the {self.name} task reads no file (task.path is for a task that does, such as "
                              f"text), got task.path={cfg.task.path!r}")
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

    def evaluate(self, model, data: Batch, cfg: "RunConfig", device, dtype: str, chunk: int | None = None,
                 causal: bool = False) -> dict[str, float]:
        """Held-out metrics of ``model`` on ``data`` (this task's :meth:`eval_set`): see
        :func:`evaluate`, which every built-in task uses. Override to score differently; return
        the same three keys, plus one value per metric of the task's own (:attr:`metrics`, e.g. ``g2p``'s
        ``wer``, ``per``) under its name: the trial row and the held-out curve rows copy those."""
        return evaluate(model, data, cfg, device, dtype, chunk=chunk, causal=causal)

    def encode_input(self, text: str, cfg: "RunConfig") -> tuple[int, ...]:
        """New input for ``python -m harness decode`` as source ids (S,), no padding. Default: token
        ids as text, ``"3 4 5"``, each in ``3 .. model.vocab - 1`` (0 pad, 1 start, 2 end are
        reserved). Override to read the task's own notation (g2p: a word's letters).

        Raises:
            ConfigError: naming the input and what the task accepts.
        """
        try:
            ids = tuple(int(t) for t in text.replace(",", " ").split())
        except ValueError:
            raise ConfigError(f"task {self.name!r} reads token ids as numbers (e.g. '3 4 5'), got {text!r}") from None
        if not ids or any(not 3 <= i < cfg.model.vocab for i in ids):
            raise ConfigError(f"task {self.name!r} takes ids 3..{cfg.model.vocab - 1}, got {text!r}")
        if len(ids) > cfg.model.max_len:
            raise ConfigError(f"{text!r} is {len(ids)} tokens long; the model takes at most model.max_len = "
                              f"{cfg.model.max_len}")
        return ids

    def decode_output(self, ids: tuple[int, ...], cfg: "RunConfig") -> str:
        """A decoded output (ids up to the end symbol, which is left out) as text. Default: the ids
        separated by spaces. Override to write the task's own notation (g2p: ARPAbet phonemes)."""
        return " ".join(str(i) for i in ids)

    def __repr__(self) -> str:
        return f"<task {self.name!r} from {self.plugin or '?'}>"


#: Draws of :meth:`Task.eval_set` the default :meth:`Task.dev_set` makes at most, and the step between their seeds.
DEV_ROUNDS, DEV_STRIDE = 20, 7919


def cat_batches(parts: list[Batch], pad: int = PAD) -> Batch:
    """Batches stacked by rows, each padded with ``pad`` on the right to the widest.

    Shape: parts k x (B_k, S_k) / (B_k, T_k) -> (sum B_k, max S_k), (sum B_k, max T_k)."""
    def cat(ts: list[torch.Tensor]) -> torch.Tensor:
        w = max(t.size(1) for t in ts)
        return torch.cat([F.pad(t, (0, w - t.size(1)), value=pad) for t in ts])
    return Batch(cat([b.src for b in parts]), cat([b.tgt for b in parts]), cat([b.tgt_y for b in parts]))


def count_overlap(eval_src: torch.Tensor, train_src) -> int:
    """The number of rows of ``eval_src`` (N, S; each repeat counts), in 0..N, that occur verbatim among the
    rows of ``train_src`` ((M, S'), or an iterable of (B_i, S') chunks), compared with trailing pads removed."""
    chunks = [train_src] if isinstance(train_src, torch.Tensor) else train_src
    seen: set[bytes] = set()
    width = eval_src.size(1)
    for chunk in chunks:
        seen.update(row_keys(chunk, width))
    return sum(k in seen for k in row_keys(eval_src, width))


def row_keys(rows: torch.Tensor, width: int) -> list[bytes]:
    """Row keys at a common width: rows narrower than ``width`` are padded; wider ones keep
    their width (their content beyond ``width`` cannot match a row of ``width``)."""
    if rows.size(1) < width:
        rows = torch.nn.functional.pad(rows, (0, width - rows.size(1)), value=PAD)
    elif rows.size(1) > width and bool((rows[:, width:] == PAD).all()):
        rows = rows[:, :width]
    return [row.tobytes() for row in rows.contiguous().numpy()]


# ---------------------------------------------------------------------------------------------
# scoring (every task): loss, held-out cross-entropy, token accuracy, exact match


def loss_fn(logits: torch.Tensor, labels: torch.Tensor, pad: int, smoothing: float) -> torch.Tensor:
    """Mean cross-entropy over non-pad labels, nats/token, with ``label_smoothing=smoothing``
    (PyTorch spreads it over all V classes); the training loss (``smoothing`` =
    ``train.label_smoothing``) and, unsmoothed, the held-out CE of :func:`evaluate`.

    Shape:
        logits (B, T, V) (cast to float32), labels (B, T) -> () float32.
    """
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), labels.reshape(-1),
                           ignore_index=pad, label_smoothing=smoothing)


@torch.no_grad()
def greedy_exact_match(model, src: torch.Tensor, tgt_y: torch.Tensor, pad: int, start: int = START,
                       memory: torch.Tensor | None = None) -> torch.Tensor:
    """Per-sequence exact match of greedy decoding, decoding only sequences still undecided.

    Makes the same decisions as ``exact_match(greedy_decode(model, src, T), tgt_y)`` from :mod:`harness.tasks.copy`
    (Annotated ``greedy_decode``): a sequence fails at its first wrong token at a non-pad label position and
    passes once every non-pad label is produced (later positions are not scored). Each decoding step drops the
    sequences that are decided, so the decoder runs on fewer rows: about 2.5x less work for a model that has
    learnt the variable-length copy task. Rows are independent in every correctly masked variant, so the
    outcome does not depend on which rows share a batch (up to float rounding, as with any change of batch size).

    Args:
        memory: the encoder output for ``src`` (B, S, D) when the caller has it already.

    Shape:
        src (B, S), tgt_y (B, T) -> (B,) bool.
    """
    b, t_max = tgt_y.shape
    keep = tgt_y != pad  # (B, T) scored positions
    pos = torch.arange(t_max, device=tgt_y.device)
    last = torch.where(keep, pos, -1).amax(dim=1) if t_max else torch.full((b,), -1, device=tgt_y.device)
    result = torch.ones(b, dtype=torch.bool, device=tgt_y.device)
    rows = torch.nonzero(last >= 0).flatten()  # undecided sequences (B',)
    style = model.mask_style
    if memory is None:
        memory = model.encode(src, style.src_mask(src, pad))  # (B, S, D)
    src_a, memory_a = src[rows], memory[rows]
    ys = torch.full((rows.numel(), 1), start, dtype=src.dtype, device=src.device)  # (B', 1)
    for t in range(t_max):
        if rows.numel() == 0:
            break
        out = model.decode(memory_a, style.src_mask(src_a, pad), ys, style.tgt_mask(ys, pad))  # (B', t+1, D)
        nxt = model.embed.logits(out[:, -1]).argmax(dim=-1)  # (B',)
        wrong = keep[rows, t] & (nxt != tgt_y[rows, t])
        result[rows[wrong]] = False
        going = ~(wrong | (last[rows] <= t))
        rows, src_a, memory_a = rows[going], src_a[going], memory_a[going]
        ys = torch.cat([ys[going], nxt[going, None].to(ys.dtype)], dim=1)  # (B'', t+2)
    return result


#: Activation elements (rows x positions x widest layer) one evaluation chunk may hold.
EVAL_CHUNK_ELEMENTS = 2**22


#: Most sequences per evaluation chunk on CUDA, where a small model's forward costs its kernel
#: launches whatever the rows: fewer, larger chunks (the g2p test split in 3 chunks, not 24).
CUDA_EVAL_CHUNK = 4096


def eval_chunk(cfg: RunConfig, positions: int | None = None, cuda: bool = False) -> int:
    """Sequences per evaluation chunk: on the CPU at most 500 (larger chunks were no faster per
    sequence at d_model = 64), on CUDA at most :data:`CUDA_EVAL_CHUNK` with 8x the element
    budget; fewer for wide models so that evaluation does not raise the trial's peak memory above
    training's (170 for the ``paper`` preset on the CPU), never fewer than the training batch.
    The chunking changes no score beyond float rounding (every chunk is summed by its tokens).

    Args:
        positions: the longest row of the evaluation data (default ``seq_len + 2``).
        cuda: the evaluation runs on a CUDA device."""
    width = max(cfg.model.d_ff, cfg.model.d_model, cfg.model.vocab)
    positions = positions or cfg.train.seq_len + 2
    cap, budget = (CUDA_EVAL_CHUNK, 8 * EVAL_CHUNK_ELEMENTS) if cuda else (500, EVAL_CHUNK_ELEMENTS)
    return max(cfg.train.batch, min(cap, budget // (positions * width)))


@torch.inference_mode()
def evaluate(model, data: Batch, cfg: RunConfig, device, dtype: str, chunk: int | None = None,
             causal: bool = False) -> dict[str, float]:
    """Held-out metrics on ``data``, leak-proof by construction: unsmoothed cross-entropy
    (nats/token), token accuracy and exact-match accuracy (fraction of sequences), all from
    :func:`prefix_logits` -- the logits at target position t come from a forward whose decoder
    input holds only the target's first t + 1 tokens, so no component can see a token it is asked
    to predict, however it is written. Chunks of ``chunk`` sequences (default :func:`eval_chunk`).

    For a causal decoder these are the teacher-forced numbers (up to float rounding, the forwards
    have other shapes: ``tests/test_train.py``), and the exact match is the event that greedy
    decoding gets every label right (:func:`greedy_exact_match`): greedy decoding feeds the gold
    prefix for as long as every earlier token was right. For a decoder that leaks it is what the
    model predicts without the future, so a leak cannot buy a better score (a leak is also caught
    and the trial marked invalid: :func:`future_leak`).

    Args:
        causal: ignored (kept for task plugins that pass it; every evaluation is prefix-only).

    Returns:
        ``{"heldout_ce", "heldout_token_acc", "exact_match"}`` as Python floats.
    """
    del causal
    chunk = chunk or eval_chunk(cfg, max(data.src.size(1), data.tgt.size(1) + 1), torch.device(device).type == "cuda")
    was_training = model.training
    model.eval()
    pad = cfg.model.pad
    tot_loss = tot_tok = tot_correct = tot_exact = 0.0
    n = data.src.size(0)
    for i in range(0, n, chunk):
        b = Batch(data.src[i:i + chunk], data.tgt[i:i + chunk], data.tgt_y[i:i + chunk]).to(device)
        keep = b.tgt_y != pad
        with autocast(device, dtype):
            logits = prefix_logits(model, b.src, b.tgt, keep, pad)  # (B, T, V)
            right = logits.argmax(-1) == b.tgt_y  # (B, T)
            exact = (right | ~keep).all(dim=1)  # (B,)
        ntok = int(keep.sum())
        tot_loss += float(loss_fn(logits, b.tgt_y, pad, 0.0)) * ntok
        tot_tok += ntok
        tot_correct += float((right & keep).sum())
        tot_exact += float(exact.sum())
    model.train(was_training)
    return {"heldout_ce": tot_loss / tot_tok, "heldout_token_acc": tot_correct / tot_tok,
            "exact_match": tot_exact / n}


def prefix_logits(model, src: torch.Tensor, tgt: torch.Tensor, keep: torch.Tensor, pad: int) -> torch.Tensor:
    """Logits at every scored target position, each from a forward that holds only the prefix.

    Row b's logits at position t are ``model.embed.logits(decode(memory, ..., tgt[b, :t + 1])[-1])``:
    the decoder input ends at the token before the label ``tgt_y[b, t]``, so the logits cannot
    depend on any later target token, whatever the components do (the encoder sees the source
    only). Only the rows with ``keep[:, t]`` run at step t (as in :func:`greedy_exact_match`, rows
    are independent in a correctly masked model); positions with ``keep`` False hold zeros.
    Cost: one decoder forward per target position, about the cost of greedy decoding.

    Shape:
        src (B, S), tgt (B, T), keep (B, T) bool -> (B, T, V).
    """
    if prefix_pass(src.device) == "batched":  # one forward (the default on CUDA): harness.tasks.prefix
        return prefix_logits_batched(model, src, tgt, keep, pad)
    style = model.mask_style
    src_mask = style.src_mask(src, pad)
    memory = model.encode(src, src_mask)  # (B, S, D)
    b, t_max = tgt.shape
    out: torch.Tensor | None = None
    for t in range(t_max):
        rows = torch.nonzero(keep[:, t]).flatten()  # (B',)
        if rows.numel() == 0:
            continue
        ys, src_r = tgt[rows, :t + 1], src[rows]  # (B', t + 1), (B', S)
        h = model.decode(memory[rows], style.src_mask(src_r, pad), ys, style.tgt_mask(ys, pad))  # (B', t+1, D)
        lg = model.embed.logits(h[:, -1])  # (B', V)
        if out is None:
            out = lg.new_zeros(b, t_max, lg.size(-1))
        out[rows, t] = lg.to(out.dtype)
    if out is None:
        raise ValueError("prefix_logits: no scored position (keep is all False)")
    return out


#: Tolerance of :func:`future_leak`: absolute part (logit units) and relative part (x max |logit|);
#: the run gate's values (:data:`harness.checks.policy.GATE_ATOL`, ``GATE_RTOL``; this layer cannot import the
#: checks, so tests/test_policy.py holds the two pairs equal), float32 on both sides.
LEAK_ATOL, LEAK_RTOL = 1e-5, 1e-4


@torch.inference_mode()
def future_leak(model, data: Batch, pad: int, device) -> tuple[float, float, float]:
    """Two checks on real held-out data, in eval mode and float32. **Future**: how far the logits
    with the whole target in the decoder input are from the prefix-only ones
    (:func:`prefix_logits`), which run first, before the whole target has been shown. **State**:
    the prefix-only pass is repeated after the whole-target one; a model whose outputs depend on
    what earlier forwards showed it (a component memorising targets between calls) moves.

    Returns:
        ``(future gap, state gap, threshold)``: max |delta logit| over the scored positions
        (``tgt_y != pad``); threshold ``LEAK_ATOL + LEAK_RTOL * max |logit|``. A causal, stateless
        decoder differs only by float rounding (the state gap is 0 on a deterministic device).
        Gaps are nan when a logit is not finite (divergence is judged elsewhere).

    Shape:
        data: ``src`` (B, S), ``tgt`` (B, T), ``tgt_y`` (B, T).
    """
    was_training = model.training
    model.eval()
    try:
        b = data.to(device)
        keep = b.tgt_y != pad
        prefix = prefix_logits(model, b.src, b.tgt, keep, pad).float()[keep]
        whole = model(b.src, b.tgt).float()[keep]  # (positions, V)
        again = prefix_logits(model, b.src, b.tgt, keep, pad).float()[keep]
    finally:
        model.train(was_training)
    return leak_gaps(prefix, whole, again)


def leak_gaps(prefix: torch.Tensor, whole: torch.Tensor, again: torch.Tensor) -> tuple[float, float, float]:
    """``(future gap, state gap, threshold)`` of :func:`future_leak` from its three passes' logits at
    the scored positions, each (positions, V) in float32: max |prefix - whole|, max |prefix - again|
    and ``LEAK_ATOL + LEAK_RTOL * max |whole|``; nan gaps where a logit is not finite."""
    thr = LEAK_ATOL + LEAK_RTOL * float(whole.abs().max()) if whole.numel() else LEAK_ATOL
    if not all(bool(torch.isfinite(x).all()) for x in (prefix, whole, again)):
        return float("nan"), float("nan"), thr
    if not prefix.numel():
        return 0.0, 0.0, thr
    return float((prefix - whole).abs().max()), float((prefix - again).abs().max()), thr
