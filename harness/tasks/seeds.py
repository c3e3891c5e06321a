"""Held-out evaluation of K seeds of one variant in one pass: the scoring of :mod:`.base` and
:mod:`.g2p` over a trial group's stacked parameters.

A trial group (:mod:`harness.group`) holds its K models as stacked tensors (row k = seed k).
:class:`SeedStack` runs the model's ``encode`` and its decoder step (``decode`` then
``embed.logits`` at the last position) for all K seeds in one call: ``torch.func.vmap`` over
``torch.func.functional_call`` with the stacked tensors (the "model ensembling" recipe of the
PyTorch tutorials). The decoding loops stay in Python outside the vmap and are shared by the K
seeds, so each evaluation chunk costs one forward per decoding step for all seeds, not K:

- :func:`evaluate_seeds_prefix`: :func:`harness.tasks.base.evaluate` for K seeds (prefix-only
  held-out CE, token accuracy, exact match). The rows decoded at step t depend only on the data
  (``tgt_y != pad``), the same rows as each seed's own evaluation.
- :func:`beam_search_seeds`: :func:`harness.tasks.decoding.beam_search` (greedy for beam 1) for K
  seeds, the same search step (``decoding._advance``) on the K x B rows. A hypothesis runs while
  any seed still decodes it (the union of the seeds' live rows); what a finished seed computes for
  it is discarded as the sequential search discards nothing it has not computed, so every seed
  makes its own decisions.
- :func:`evaluate_seeds_g2p`: :func:`harness.tasks.g2p.evaluate_g2p` for K seeds (CE, token
  accuracy, WER, PER, exact match).

Equality with each seed's own evaluation: the same rows, ops and order; a vmapped matmul and a
decoding batch of other rows round differently, so CE agrees to float rounding (tested within
1e-5 relative on the CPU) and the argmax decisions (exact match, token accuracy, WER, PER) are
equal barring float ties (``tests/test_group_eval.py``). :func:`evaluate_seeds` picks the
batched version of a task's ``evaluate``; a task that overrides ``evaluate`` (a plugin's own
scoring) raises :class:`NotBatched`, and the caller evaluates each seed on its own model.
"""
from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Callable

import torch
from torch import nn
from torch.func import functional_call, vmap

from ..env import autocast
from .base import PAD, START, Batch, Task, eval_chunk, leak_gaps, loss_fn
from .decoding import _advance, _strip, error_counts
from .g2p import CUDA_EVAL_CHUNK, MAX_PHONES, G2PTask, _trim, lexicon
from ..env import prefix_pass
from .prefix import model_max_len, prefix_rows, row_chunk, scatter_positions
from .text import TextTask, with_bpc

if TYPE_CHECKING:
    from ..config import RunConfig

#: A batched evaluation chunk holds the rows of the sequential chunk for at most this many seeds at
#: once; larger groups take proportionally fewer rows a chunk (activation memory stays within 8x a
#: sequential evaluation's).
MAX_STACKED_CHUNKS = 8

Progress = Callable[[int], None]


class NotBatched(Exception):
    """The task's evaluation has no batched version (it overrides ``Task.evaluate``)."""


class _Call(nn.Module):
    """``fn(model, *args)`` as a module's forward, so ``functional_call`` can run any method of the
    model with swapped tensors (their names get the prefix ``m.``)."""

    def __init__(self, model: nn.Module, fn: Callable):
        super().__init__()
        self.m, self.fn = model, fn

    def forward(self, *args):
        return self.fn(self.m, *args)


class SeedStack:
    """K models of one variant as stacked tensors, run together in eval mode.

    Args:
        model: one model of the variant (its module tree; its own tensors are not used).
        tensors: name -> (K, ...) stacked parameters and buffers (``named_parameters`` /
            ``named_buffers`` names), read at each call (a trial group's live state).
        pad: the pad id (masks).
    """

    def __init__(self, model: nn.Module, tensors: dict[str, torch.Tensor], pad: int):
        base = copy.deepcopy(model).to("meta").eval()
        style = base.mask_style
        self.tensors, self.pad = tensors, pad
        self.k = next(iter(tensors.values())).size(0)
        self._encode = _Call(base, lambda m, src: m.encode(src, style.src_mask(src, pad)))
        self._step = _Call(base, lambda m, memory, src, ys: m.embed.logits(
            m.decode(memory, style.src_mask(src, pad), ys, style.tgt_mask(ys, pad))[:, -1]))
        self._whole = _Call(base, lambda m, src, tgt: m(src, tgt))
        self._at = _Call(base, lambda m, memory, src, ys, pos: m.embed.logits(m.decode(
            memory, style.src_mask(src, pad), ys, style.tgt_mask(ys, pad))[torch.arange(ys.size(0), device=ys.device), pos]))
        self._model = model

    def select(self, seeds: list[int]) -> "SeedStack":
        """The stack of the seeds ``seeds`` (rows of this one, copied)."""
        index = torch.tensor(seeds, device=next(iter(self.tensors.values())).device)
        return SeedStack(self._model, {n: t.index_select(0, index) for n, t in self.tensors.items()}, self.pad)

    def _run(self, call: _Call, args: tuple, in_dims: tuple) -> torch.Tensor:
        named = {"m." + n: t for n, t in self.tensors.items()}
        return vmap(lambda p, *a: functional_call(call, p, a), in_dims=(0,) + in_dims)(named, *args)

    def encode(self, src: torch.Tensor) -> torch.Tensor:
        """Every seed's encoder output. Shape: src (B, S) (shared) -> memory (K, B, S, D)."""
        return self._run(self._encode, (src,), (None,))

    def whole_logits(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        """Every seed's teacher-forced logits (the whole target in the decoder input, the model's own
        forward). Shape: src (B, S), tgt (B, T) (shared) -> (K, B, T, V)."""
        return self._run(self._whole, (src, tgt), (None, None))

    def step_logits(self, memory: torch.Tensor, src: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        """Every seed's logits at the last position of ``ys``. Shape: memory (K, B, S, D), src (B, S)
        (shared), ys (B, t) (shared) or (K, B, t) (per seed) -> (K, B, V)."""
        return self._run(self._step, (memory, src, ys), (0, None, 0 if ys.dim() == 3 else None))

    def position_logits(self, memory: torch.Tensor, src: torch.Tensor, ys: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Every seed's logits of row i at position ``pos[i]`` (the one-pass prefix logits,
        :mod:`harness.tasks.prefix`). Shape: memory (K, P, S, D), src (P, S), ys (P, W), pos (P,)
        (shared) -> (K, P, V)."""
        return self._run(self._at, (memory, src, ys, pos), (0, None, None, None))


def group_chunk(chunk: int, k: int) -> int:
    """Rows per chunk of a K-seed evaluation whose sequential chunk is ``chunk`` rows: the same
    rows up to :data:`MAX_STACKED_CHUNKS` seeds, then fewer (at least 1)."""
    return max(1, chunk * min(k, MAX_STACKED_CHUNKS) // k)


def prefix_logits_seeds(stack: SeedStack, src: torch.Tensor, tgt: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """:func:`harness.tasks.base.prefix_logits` of K seeds: the same rows and prefixes, every
    decoding step one vmapped call, or in the batched pass (CUDA's default, ``HARNESS_PREFIX_PASS``) all
    positions in one (:mod:`harness.tasks.prefix`). Shape: src (B, S), tgt (B, T), keep (B, T) -> (K, B, T, V)."""
    memory = stack.encode(src)  # (K, B, S, D)
    b, t_max = tgt.shape
    if prefix_pass(src.device) == "batched":
        rows, pos, ys = prefix_rows(tgt, keep, stack.pad, model_max_len(stack._model))
        return scatter_positions(rows, pos, b, t_max, row_chunk(stack._model, ys.size(1), stack.k),
                                 lambda sl: stack.position_logits(memory[:, rows[sl]], src[rows[sl]], ys[sl], pos[sl]))
    out: torch.Tensor | None = None
    for t in range(t_max):
        rows = torch.nonzero(keep[:, t]).flatten()  # (B',) the same rows for every seed
        if rows.numel() == 0:
            continue
        lg = stack.step_logits(memory[:, rows], src[rows], tgt[rows, :t + 1])  # (K, B', V)
        if out is None:
            out = lg.new_zeros(stack.k, b, t_max, lg.size(-1))
        out[:, rows, t] = lg.to(out.dtype)
    if out is None:
        raise ValueError("prefix_logits_seeds: no scored position (keep is all False)")
    return out


@torch.inference_mode()
def future_leak_seeds(stack: SeedStack, data: Batch, device) -> list[tuple[float, float, float]]:
    """:func:`harness.tasks.base.future_leak` of K seeds on the same held-out rows, in float32 as
    there: per seed ``(future gap, state gap, threshold)``. The three passes (prefix-only, whole
    target, prefix-only again) run in that order for all seeds at once, on the one module tree the
    stack calls, so a component that keeps state between forwards shows it to every seed's check.

    Shape:
        data: ``src`` (B, S), ``tgt`` (B, T), ``tgt_y`` (B, T).
    """
    b = data.to(device)
    keep = b.tgt_y != stack.pad
    prefix = prefix_logits_seeds(stack, b.src, b.tgt, keep).float()  # (K, B, T, V)
    whole = stack.whole_logits(b.src, b.tgt).float()
    again = prefix_logits_seeds(stack, b.src, b.tgt, keep).float()
    return [leak_gaps(prefix[s][keep], whole[s][keep], again[s][keep]) for s in range(stack.k)]


@torch.inference_mode()
def evaluate_seeds_prefix(stack: SeedStack, data: Batch, cfg: "RunConfig", device, dtype: str,
                          chunk: int | None = None, progress: Progress | None = None) -> list[dict[str, float]]:
    """:func:`harness.tasks.base.evaluate` for the K seeds of ``stack``: per seed
    ``{"heldout_ce", "heldout_token_acc", "exact_match"}``. ``chunk``: rows a chunk (default the
    sequential chunk, :func:`group_chunk`); ``progress(rows)`` after each chunk."""
    pad = cfg.model.pad
    seq = eval_chunk(cfg, max(data.src.size(1), data.tgt.size(1) + 1), torch.device(device).type == "cuda")
    chunk = chunk or group_chunk(seq, stack.k)
    k, n = stack.k, data.src.size(0)
    tot_loss, tot_correct, tot_exact = [0.0] * k, [0.0] * k, [0.0] * k
    tot_tok = 0.0
    for i in range(0, n, chunk):
        b = Batch(data.src[i:i + chunk], data.tgt[i:i + chunk], data.tgt_y[i:i + chunk]).to(device)
        keep = b.tgt_y != pad
        with autocast(device, dtype):
            logits = prefix_logits_seeds(stack, b.src, b.tgt, keep)  # (K, B, T, V)
            right = logits.argmax(-1) == b.tgt_y  # (K, B, T)
            exact = (right | ~keep).all(dim=2)  # (K, B)
        ntok = int(keep.sum())
        tot_tok += ntok
        correct, exacts = (right & keep).sum(dim=(1, 2)).tolist(), exact.sum(dim=1).tolist()
        for s in range(k):
            tot_loss[s] += float(loss_fn(logits[s], b.tgt_y, pad, 0.0)) * ntok
            tot_correct[s] += correct[s]
            tot_exact[s] += exacts[s]
        if progress:
            progress(b.src.size(0))
    return [{"heldout_ce": tot_loss[s] / tot_tok, "heldout_token_acc": tot_correct[s] / tot_tok,
             "exact_match": tot_exact[s] / n} for s in range(k)]


@torch.no_grad()
def beam_search_seeds(stack: SeedStack, src: torch.Tensor, max_steps: int, beam: int) -> list[list[tuple[int, ...]]]:
    """:func:`harness.tasks.decoding.beam_search` (beam 1: greedy) of K seeds on the same source
    rows, one vmapped decoder call per step; stops when every hypothesis of every seed has
    finished or after ``max_steps`` tokens.

    Shape:
        src (B, S) -> K lists of B tuples of ids (end symbol removed).
    """
    k, b, w, dev = stack.k, src.size(0), beam, src.device
    memory = stack.encode(src)  # (K, B, S, D)
    rows = torch.arange(b, device=dev).repeat_interleave(w)  # (B*W,) source row of each hypothesis
    ys = torch.full((k, b * w, 1), START, dtype=src.dtype, device=dev)  # (K, B*W, 1)
    score = torch.full((k * b, w), float("-inf"), device=dev)  # the K seeds' rows one after another
    score[:, 0] = 0.0
    done = torch.zeros(k * b, w, dtype=torch.bool, device=dev)
    for _ in range(max_steps):
        live = ~done.view(k, b * w).all(dim=0)  # (B*W,) hypotheses some seed still decodes
        if not bool(live.any()):
            break
        idx = live.nonzero().flatten()
        lg = stack.step_logits(memory[:, rows[idx]], src[rows[idx]], ys[:, idx])  # (K, B', V)
        logp = torch.full((k, b * w, lg.size(-1)), float("-inf"), device=dev)
        logp[:, idx] = torch.log_softmax(lg.float(), dim=-1)  # a finished hypothesis's row: replaced by _advance
        flat, score, done = _advance(ys.reshape(k * b * w, -1), score, done, logp.reshape(k * b * w, -1), w)
        ys = flat.view(k, b * w, -1)
    best = score.argmax(dim=1).tolist()  # (K*B,)
    flat = ys.reshape(k * b * w, -1)
    return [[_strip(flat[(s * b + r) * w + best[s * b + r], 1:].tolist()) for r in range(b)] for s in range(k)]


def evaluate_seeds_g2p(stack: SeedStack, data: Batch, cfg: "RunConfig", device, dtype: str,
                       chunk: int | None = None, progress: Progress | None = None) -> list[dict[str, float]]:
    """:func:`harness.tasks.g2p.evaluate_g2p` for the K seeds of ``stack`` (the same chunks,
    trimmed): per seed ``heldout_ce``, ``heldout_token_acc``, ``exact_match``, ``wer``, ``per``."""
    k = stack.k
    chunk = chunk or group_chunk(CUDA_EVAL_CHUNK if torch.device(device).type == "cuda" else 500, k)
    refs = lexicon(cfg.task.split).refs
    ce, acc, wrong, edits, length = [0.0] * k, [0.0] * k, [0] * k, [0] * k, [0] * k
    tok = 0
    n = data.src.size(0)
    for i in range(0, n, chunk):
        b = _trim(Batch(data.src[i:i + chunk], data.tgt[i:i + chunk], data.tgt_y[i:i + chunk]))
        ntok = b.ntokens
        tok += ntok
        ms = evaluate_seeds_prefix(stack, b, cfg, device, dtype, chunk=b.src.size(0))
        with torch.inference_mode(), autocast(device, dtype):
            hyps = beam_search_seeds(stack, b.src.to(device), MAX_PHONES + 1, cfg.train.beam)
        words = [refs[tuple(r[r != PAD].tolist())] for r in b.src]
        for s in range(k):
            ce[s], acc[s] = ce[s] + ms[s]["heldout_ce"] * ntok, acc[s] + ms[s]["heldout_token_acc"] * ntok
            w, e, ln = error_counts(hyps[s], words)
            wrong[s], edits[s], length[s] = wrong[s] + w, edits[s] + e, length[s] + ln
        if progress:
            progress(b.src.size(0))
    return [{"heldout_ce": ce[s] / tok, "heldout_token_acc": acc[s] / tok, "exact_match": 1 - wrong[s] / n,
             "wer": wrong[s] / n, "per": edits[s] / max(1, length[s])} for s in range(k)]


def evaluate_seeds(task: Task, stack: SeedStack, data: Batch, cfg: "RunConfig", device, dtype: str,
                   progress: Progress | None = None) -> list[dict[str, float]]:
    """The batched version of ``task.evaluate`` for the K seeds of ``stack``, in seed order: the
    shared scoring (:func:`evaluate_seeds_prefix`; ``text`` adds ``bpc``) or g2p's (:func:`evaluate_seeds_g2p`).

    Raises:
        NotBatched: the task overrides ``evaluate`` with scoring of its own.
    """
    own = type(task).evaluate
    if own is Task.evaluate:
        return evaluate_seeds_prefix(stack, data, cfg, device, dtype, progress=progress)
    if own is G2PTask.evaluate:
        return evaluate_seeds_g2p(stack, data, cfg, device, dtype, progress=progress)
    if own is TextTask.evaluate:
        return [with_bpc(m) for m in evaluate_seeds_prefix(stack, data, cfg, device, dtype, progress=progress)]
    raise NotBatched(f"task {task.name!r} scores with its own evaluate()")
