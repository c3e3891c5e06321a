"""Free-running decoding (greedy and beam search) and the G2P field's error rates (WER, PER).

Both decoders feed the model only its own predictions (the decoder input of step t holds the
start symbol and the t tokens decoded so far), so they are leak-proof by construction: a
component that looks at a later target token has no target to look at. Every row stops at the
end symbol (2); rows are decoded in one batch (B, or B x K for the beam), finished rows are
dropped from the batch as they finish (as in :func:`harness.tasks.base.greedy_exact_match`).

Error rates (the field's definitions: Bisani & Ney 2008 §5; Yao & Zweig 2015 §5; Yolchuyeva et
al. 2019 §4): **WER** = share of words whose hypothesis matches none of the word's reference
pronunciations; **PER** = sum over words of the Levenshtein distance (substitutions, insertions,
deletions of phonemes; ``rapidfuzz.distance.Levenshtein`` on id sequences) to the closest reference,
divided by the sum of that reference's lengths.
"""
from __future__ import annotations

from typing import Sequence

import torch
from rapidfuzz.distance import Levenshtein

from .base import END, START


def _strip(row: Sequence[int]) -> tuple[int, ...]:
    """Ids up to (not including) the first end symbol or pad (0)."""
    out = []
    for t in row:
        if t in (END, 0):
            break
        out.append(int(t))
    return tuple(out)


@torch.no_grad()
def greedy(model, src: torch.Tensor, max_steps: int, pad: int = 0) -> list[tuple[int, ...]]:
    """Greedy decoding (Annotated ``greedy_decode``), each row stopped at its end symbol.

    Args:
        model: a :class:`harness.model.EncoderDecoder` (the caller puts it in eval mode).
        src: (B, S) source ids.
        max_steps: most tokens generated per row (the end symbol included).

    Returns:
        B tuples of predicted ids, the end symbol and anything after it removed.
    """
    return beam_search(model, src, max_steps, 1, pad)


@torch.no_grad()
def beam_search(model, src: torch.Tensor, max_steps: int, beam: int, pad: int = 0) -> list[tuple[int, ...]]:
    """Beam search of width ``beam`` over the sum of token log-probabilities (no length
    normalisation), the best finished hypothesis per row; ``beam=1`` is greedy decoding.

    A hypothesis finishes when it emits the end symbol; a row stops when its best ``beam``
    hypotheses have finished or after ``max_steps`` tokens (unfinished hypotheses then compete
    with their current score). Sutskever et al. 2014 §3.2 (left-to-right beam search); Vaswani
    et al. 2017 §6.1 use beam 4 with a length penalty, which this search does not apply.

    Shape:
        src (B, S) -> B tuples of ids (end symbol removed).
    """
    b, k, dev = src.size(0), beam, src.device
    style = model.mask_style
    memory = model.encode(src, style.src_mask(src, pad))  # (B, S, D)
    rows = torch.arange(b, device=dev).repeat_interleave(k)  # (B*K,) source row of each hypothesis
    ys = torch.full((b * k, 1), START, dtype=src.dtype, device=dev)  # (B*K, 1)
    score = torch.full((b, k), float("-inf"), device=dev)
    score[:, 0] = 0.0  # one live hypothesis per row at the start: the K copies would tie
    done = torch.zeros(b, k, dtype=torch.bool, device=dev)
    for _ in range(max_steps):
        live = ~done.flatten()  # (B*K,)
        if not bool(live.any()):
            break
        idx = live.nonzero().flatten()
        src_l = src[rows[idx]]
        out = model.decode(memory[rows[idx]], style.src_mask(src_l, pad), ys[idx], style.tgt_mask(ys[idx], pad))
        logp = torch.full((b * k, model.cfg.vocab), float("-inf"), device=dev)
        logp[idx] = torch.log_softmax(model.embed.logits(out[:, -1]).float(), dim=-1)  # (B', V)
        ys, score, done = _advance(ys, score, done, logp, k)
    best = score.argmax(dim=1)  # (B,)
    return [_strip(ys[r * k + int(best[r]), 1:].tolist()) for r in range(b)]


def _advance(ys, score, done, logp, k):
    """One beam step: extend every live hypothesis by every token, keep the K best per row;
    a finished hypothesis is carried over unchanged (one candidate, its own score)."""
    b = score.size(0)
    v = logp.size(-1)
    cand = score.reshape(b * k, 1) + logp  # (B*K, V)
    fin = done.flatten()
    carry = torch.full_like(cand[fin], float("-inf"))
    carry[:, 0] = score.flatten()[fin]  # token 0 (pad) stands for "stay finished"
    cand[fin] = carry
    top, pos = cand.reshape(b, k * v).topk(k, dim=1)  # (B, K)
    parent = pos // v + torch.arange(b, device=ys.device)[:, None] * k  # (B, K) flat index of the parent
    token = pos % v  # (B, K)
    was_done = done.flatten()[parent.flatten()].reshape(b, k)
    token = torch.where(was_done, torch.zeros_like(token), token)
    ys = torch.cat([ys[parent.flatten()], token.flatten()[:, None].to(ys.dtype)], dim=1)  # (B*K, t+1)
    done = was_done | (token == END)
    return ys, top, done


def error_counts(hyps: Sequence[Sequence[int]], refs: Sequence[Sequence[Sequence[int]]]) -> tuple[int, int, int]:
    """(word errors, phoneme edits, reference phonemes) of hypotheses against their references.

    A word is right when its hypothesis equals any of its references; its phoneme edits are the
    Levenshtein distance to the closest reference (``rapidfuzz.distance.Levenshtein.distance`` on
    the id sequences), whose length enters the denominator (ties: the first such reference).

    Args:
        hyps: one id sequence per word.
        refs: per word, one or more reference id sequences (non-empty).
    """
    wrong = edits = length = 0
    for hyp, alts in zip(hyps, refs, strict=True):
        hyp = tuple(hyp)
        dists = [Levenshtein.distance(hyp, tuple(r)) for r in alts]
        best = min(range(len(alts)), key=dists.__getitem__)
        wrong += dists[best] != 0
        edits += dists[best]
        length += len(alts[best])
    return wrong, edits, length


def wer_per(hyps, refs) -> tuple[float, float]:
    """(WER, PER) as fractions (module docstring)."""
    wrong, edits, length = error_counts(hyps, refs)
    return wrong / max(1, len(hyps)), edits / max(1, length)
