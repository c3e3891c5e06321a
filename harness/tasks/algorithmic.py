"""``reverse`` and ``sort``: standard algorithmic sequence-to-sequence tasks on the padded layout
and with the held-out hash split of :mod:`harness.tasks.copy` (the split is on the source, so no
evaluation source occurs in training).

Both come from the algorithmic tasks used to probe sequence models: reversal (Sutskever et al.
2014 §3.3 reverse the source order; Grefenstette et al. 2015, "Learning to Transduce with
Unbounded Memory", reversal) and sorting (Vinyals et al. 2015, "Pointer Networks" / "Order
Matters", sort a set of numbers).
"""
from __future__ import annotations

import torch

from .base import PAD
from .copy import HashSplitTask


class ReverseTask(HashSplitTask):
    """``reverse``: output the source content in reverse order, then the end symbol.

    Example: src ``[5, 7, 3, 0]`` -> tgt_y ``[3, 7, 5, 2, 0]``. Layout as ``copy`` (content
    lengths 1..L, ids 3..V-1, padding); source Grefenstette et al. 2015 (reversal transduction).
    """

    name = "reverse"
    summary = "output the source reversed; content length 1..L with padding, ids 3..V-1"
    source = "Grefenstette et al. 2015 (Learning to Transduce, reversal); hash split"

    def answer(self, src: torch.Tensor, length: torch.Tensor, vocab: int) -> torch.Tensor:
        pos = torch.arange(src.size(1))  # (W,)
        idx = torch.where(pos < length, length - 1 - pos, pos)  # (B, W) reversed within the content
        return src.gather(1, idx)


class SortTask(HashSplitTask):
    """``sort``: output the source content sorted in ascending id order (repeats kept), then the
    end symbol.

    Example: src ``[5, 7, 3, 5, 0]`` -> tgt_y ``[3, 5, 5, 7, 2, 0]``. Layout as ``copy``; source
    Vinyals et al. 2015 (Pointer Networks / Order Matters, sorting). The split is on the source
    sequence: a held-out source is never seen in training, though its sorted output (shared by its
    permutations) may be.
    """

    name = "sort"
    summary = "output the source sorted ascending; content length 1..L with padding, ids 3..V-1"
    source = "Vinyals et al. 2015 (Pointer Networks; Order Matters: sorting); hash split"

    def answer(self, src: torch.Tensor, length: torch.Tensor, vocab: int) -> torch.Tensor:
        big = torch.iinfo(src.dtype).max
        out = src.masked_fill(src == PAD, big).sort(dim=1).values  # (B, W) pads last
        return out.masked_fill_(out == big, PAD)
