"""The copy task: the model must reproduce its source sequence.

Two versions (``TrainConfig.task``):

* ``copy`` -- seed 001's ``generate_data``: vocabulary V with 0 = pad, 1 = start, 2 = end;
  each row draws a content length in 1..L uniformly and content tokens from 3..V-1;
  ``src`` (B, L) = content then pad, ``tgt`` (B, L+1) = [1, content, 2, pad...][:-1] (decoder
  input) and ``tgt_y`` (B, L+1) = [content, 2, pad...] (labels). Source padding is real, so
  padding masks matter.
* ``copy_fixed`` -- the Annotated Transformer's ``data_gen``: ``data = randint(1, V, (B, L))``
  with ``data[:, 0] = 1``, ``src = data``, ``tgt = data[:, :-1]``, ``tgt_y = data[:, 1:]``; no padding.

Batches are drawn on the CPU from a ``torch.Generator`` and then moved to the device, so the
same seed gives the same data on every device and for every variant (paired seeds).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

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


def make_batch(task: str, batch: int, seq_len: int, vocab: int, generator: torch.Generator) -> Batch:
    """Draw one batch of the copy task on the CPU (see the module docstring for the layout).

    Raises:
        ValueError: unknown ``task``.
    """
    if task == "copy":
        data = torch.randint(3, vocab, (batch, seq_len + 2), generator=generator)
        data[:, 0] = START
        eos = torch.randint(2, seq_len + 2, (batch, 1), generator=generator)  # (B, 1) end position
        pos = torch.arange(seq_len + 2)
        data[pos >= eos] = PAD
        src = data[:, 1:-1].clone()  # (B, L)
        data.scatter_(1, eos, END)
        return Batch(src, data[:, :-1].clone(), data[:, 1:].clone())
    if task == "copy_fixed":
        data = torch.randint(1, vocab, (batch, seq_len), generator=generator)
        data[:, 0] = START
        return Batch(data.clone(), data[:, :-1].clone(), data[:, 1:].clone())
    raise ValueError(f"unknown task {task!r}")


def eval_set(task: str, n: int, seq_len: int, vocab: int, seed: int) -> Batch:
    """The fixed held-out set: ``n`` sequences drawn from ``seed`` (shared by every trial)."""
    return make_batch(task, n, seq_len, vocab, torch.Generator().manual_seed(seed))


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
