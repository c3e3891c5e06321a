"""Prefix-only logits in one decoder pass: the strategy for launch-bound devices (CUDA's default).

:func:`harness.tasks.base.prefix_logits` (the default) runs one decoder forward per target
position t, on the rows scored there, each holding exactly the target's first t + 1 tokens. On a
GPU a small model's evaluation is then bound by kernel launches: the decoder's ops run once per
target position, and every periodic evaluation runs three such passes (the scores and the
future-leak check's two).

:func:`prefix_logits_batched` gives each scored position (b, t) a row of its own and runs them all
in one decoder forward: row (b, t) holds ``tgt[b, :t + 1]`` followed by pads up to a width W
set by the batch's shape, so no row holds a later target token. What it gives up: the loop's
inputs have width t + 1, these have W, and in a chunk of rows sorted by length (g2p trims each
chunk to its longest row) W tells a row roughly how long the rows around it are. So W is one
column wider than the data (when ``max_len`` allows): a component that reads the decoder input's
width then sees another width here than in the future-leak check's whole-target pass, and the check
shows the gap and marks the trial invalid. At least 4x fewer ops (``tests/test_prefix_pass.py``);
a pass larger than :data:`PREFIX_ELEMENTS` runs as a few forwards of fewer rows each (:func:`row_chunk`);
the decoder works on W positions a row instead of t + 1, about twice the arithmetic for the copy
task, so on a CPU, where arithmetic bounds it, it is slower. For a causal decoder the logits
equal the default's up to float rounding (~2e-6 in float32, within the future-leak check's tolerance).

Chosen with the environment variable :data:`harness.env.PREFIX_ENV` (:func:`harness.env.prefix_pass`):
``auto`` (the default: ``batched`` on a CUDA device, ``loop`` elsewhere), ``loop`` or ``batched``, read
at each call, so worker processes inherit it; a run's environment block records the pass its device gets
(:func:`harness.env.environment`). Measured on an H200 (``results/reference/gpu-h200-run5``): the
main job's evaluations take half the time (summed over its 11 trials 16.1-16.7 s -> 7.8-9.1 s, three
runs each), with the same scores.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F



def prefix_rows(tgt: torch.Tensor, keep: torch.Tensor, pad: int, max_len: int | None):
    """The one-pass decoder input: ``(rows, pos, ys)``, the scored positions (b, t) as row and
    position indices (P,) and their inputs ``ys`` (P, W): ``tgt[b, :t + 1]`` then pads, W one
    column wider than ``tgt`` when ``max_len`` (the model's) allows.

    Raises:
        ValueError: no scored position (``keep`` all False).
    """
    t_max = tgt.size(1)
    rows, pos = torch.nonzero(keep, as_tuple=True)  # (P,), (P,)
    if rows.numel() == 0:
        raise ValueError("prefix_logits: no scored position (keep is all False)")
    width = t_max + 1 if max_len is None or t_max + 1 <= max_len else t_max
    ys = F.pad(tgt[rows], (0, width - t_max), value=pad)  # (P, W)
    later = torch.arange(width, device=tgt.device)[None, :] > pos[:, None]  # (P, W) after position t
    return rows, pos, ys.masked_fill(later, pad)


#: Activation elements (rows x width x widest layer, times the seeds of a group) one one-pass decoder
#: forward may hold: 256 MiB a float32 activation. A larger pass is split by rows
#: (:func:`row_chunk`), so the one pass never holds more than a few times what the loop's widest
#: step holds (its rows are about T / 2 times the loop's).
PREFIX_ELEMENTS = 2**26


def row_chunk(model, width: int, seeds: int = 1) -> int | None:
    """Rows of one one-pass decoder forward of ``width`` positions, for ``seeds`` stacked seeds:
    :data:`PREFIX_ELEMENTS` over width x the model's widest layer (``cfg.d_ff``, ``d_model``,
    ``vocab``) x seeds, at least 1; None (no limit) for a model without that ``cfg``."""
    cfg = getattr(model, "cfg", None)
    widest = max(int(getattr(cfg, k, 0) or 0) for k in ("d_ff", "d_model", "vocab"))
    return max(1, PREFIX_ELEMENTS // (width * widest * seeds)) if widest else None


def model_max_len(model) -> int | None:
    """The model's ``cfg.max_len`` (None when it has none)."""
    return getattr(getattr(model, "cfg", None), "max_len", None)


def prefix_logits_batched(model, src: torch.Tensor, tgt: torch.Tensor, keep: torch.Tensor, pad: int) -> torch.Tensor:
    """:func:`harness.tasks.base.prefix_logits` in one decoder forward (see the module docstring).

    Shape:
        src (B, S), tgt (B, T), keep (B, T) bool -> (B, T, V); positions with ``keep`` False hold zeros.

    Raises:
        ValueError: no scored position (``keep`` all False).
    """
    b, t_max = tgt.shape
    rows, pos, ys = prefix_rows(tgt, keep, pad, model_max_len(model))
    style = model.mask_style
    memory = model.encode(src, style.src_mask(src, pad))  # (B, S, D)
    def logits_of(sl: slice) -> torch.Tensor:  # (P', V) of the scored positions rows[sl]
        r, y = rows[sl], ys[sl]
        h = model.decode(memory[r], style.src_mask(src[r], pad), y, style.tgt_mask(y, pad))  # (P', W, D)
        return model.embed.logits(h[torch.arange(r.numel(), device=h.device), pos[sl]])

    return scatter_positions(rows, pos, b, t_max, row_chunk(model, ys.size(1)), logits_of)


def scatter_positions(rows: torch.Tensor, pos: torch.Tensor, b: int, t_max: int, cap: int | None,
                      logits_of) -> torch.Tensor:
    """The one pass in chunks of at most ``cap`` scored positions (all at once for None):
    ``logits_of(slice)`` gives the logits (..., P', V) of ``rows[slice]`` at ``pos[slice]``; they are
    placed at (row, position) of a zero (..., B, T, V) tensor (``...``: a group's K seeds or none)."""
    cap = cap or rows.numel()
    out = None
    for i in range(0, rows.numel(), cap):  # one forward unless the rows exceed PREFIX_ELEMENTS
        sl = slice(i, i + cap)
        lg = logits_of(sl)
        if out is None:
            out = lg.new_zeros(*lg.shape[:-2], b, t_max, lg.size(-1))
        out[..., rows[sl], pos[sl], :] = lg.to(out.dtype)
    return out
