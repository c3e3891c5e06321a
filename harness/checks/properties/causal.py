"""The causal property: no output at a real target position depends on a later target token, or on the
batch it is in (:func:`probe_causal`).

For every cut c, the target after position c is (a) redrawn with other real tokens, (b) replaced by padding (the
target gets shorter) and (c) extended where it was padded (the target gets longer); logits at real positions <= c
must not move. (b) and (c) catch a component that learns the target's length from its padding, which (a) alone
cannot. Source: the decoder's causal mask (Vaswani et al. 2017, §3.2.3; d2l §10.7.4).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ...config import ModelConfig
from ..inputs import fmt_size
from .measure import TRAIN_ONLY, ProbeResult, batch_statistics, non_finite_result, other_ids, probe_logits


def _batch_dependence(model, src, tgt, base, real, copies: int, threshold: float, device, dtype) -> str:
    """The eval-mode causal probe stacks its changed targets into one forward of ``copies`` x B rows. When
    the *unchanged* batch, stacked the same way, already moves its rows' logits (at real positions, in any
    copy: a fault may touch only the rows past some index), the model's output depends on the batch it is in
    (a batch-size branch, statistics over the batch, rows treated by their index), not on the future: the
    phrase that says so, else ""."""
    if copies < 2:
        return ""
    out = probe_logits(model, src.repeat(copies, 1), tgt.repeat(copies, 1), None, device, dtype, "eval", 0)
    d = (out - base.repeat(copies, 1, 1)).abs()  # (copies * B, T, V)
    moved = float(torch.nan_to_num(d, nan=math.inf).masked_fill(~real.repeat(copies, 1)[..., None], 0.0).max())
    if moved <= threshold:
        return ""
    return (f"but the unchanged batch's own logits move too when it is evaluated as {copies} x {src.size(0)} rows "
            f"(by up to {fmt_size(moved)}), the way this probe evaluates its changes: the model's output depends on "
            f"the batch it is in (rows of a correct model are independent; e.g. a branch on the batch size, a mask "
            f"that is causal only for small batches, statistics over the batch, rows treated by their index)")


def _changed_positions(out: torch.Tensor, base: torch.Tensor, real: torch.Tensor, upto: int) -> torch.Tensor:
    """max |Δ logit| per target position 0..upto at real rows (upto + 1,)."""
    d = torch.nan_to_num((out[:, :upto + 1] - base[:, :upto + 1]).abs(), nan=math.inf)  # (B, c+1, V)
    return d.masked_fill(~real[:, :upto + 1, None], 0.0).amax(dim=(0, 2))


def _causal_changes(tgt: torch.Tensor, cfg: ModelConfig, g: torch.Generator, cuts) -> list[tuple[int, str, torch.Tensor]]:
    """(cut c, kind, changed target (B, T)) for every cut and kind that changes something."""
    out = []
    for c in cuts:
        for kind in _HOW:
            changed = tgt.clone()
            after = changed[:, c + 1:]
            if kind == "redrawn":
                after.copy_(other_ids(after, cfg, g))
            elif kind == "padded":
                after.fill_(cfg.pad)
            else:
                after.copy_(torch.where(after == cfg.pad, other_ids(after, cfg, g), after))
            if not torch.equal(changed, tgt):
                out.append((c, kind, changed))
    return out


_HOW = {"redrawn": "were redrawn", "padded": "were replaced by padding (the target got shorter)",
        "extended": "replaced the padding (the target got longer)"}



#: A train-mode leak's cause when the changed batch, evaluated on its own, leaks in evaluation mode too.
CONTENT = ("in evaluation mode too when the changed batch is evaluated on its own (the evaluation-mode probe, which "
           "passed, stacks every change into one batch): the mask depends on what the batch holds (e.g. which ids "
           "appear in it), not on training")


def _leak_detail(model, src, tgt, real, base, leak, mode: str, eval_passed: bool, copies: int, threshold: float,
                 device, dtype) -> str:
    """:func:`probe_causal`'s failure line for ``leak`` = (position, cut, max change, kind, changed target (B, T)),
    with its cause: BatchNorm statistics; in train mode with the eval-mode probe passed, the content of the batch
    (:data:`CONTENT`: the changed batch alone leaks in eval mode too) or training alone (:data:`TRAIN_ONLY`); in eval
    mode, the batch it is in (:func:`_batch_dependence`); else the future, through the padding or not."""
    p, c, x, kind, changed = leak
    what = "target tokens after position" if kind != "extended" else "real tokens after position"
    stats = batch_statistics(model, mode, prefer="decoder")
    if not stats and mode == "train" and eval_passed:
        alone = probe_logits(model, src, changed, None, device, dtype, "eval", 0)
        evaluated = probe_logits(model, src, tgt, None, device, dtype, "eval", 0)
        stats = CONTENT if float(_changed_positions(alone, evaluated, real, c).max()) > threshold else TRAIN_ONLY
    batch = _batch_dependence(model, src, tgt, base, real, copies, threshold, device,
                              dtype) if mode == "eval" and not stats else ""
    return (f"decoder position {p} changed (max |Δ logit| {fmt_size(x)}) when the {what} {c} {_HOW[kind]} "
            f"({mode} mode): " + (batch if batch else "it sees the future "
            + (stats if stats else "through the padding (e.g. the target's length)" if kind != "redrawn" else
               "(causal mask not applied or shifted)")))


def _cuts(t: int, mode: str, cuts: str) -> list[int]:
    """The cut positions of :func:`probe_causal` for targets of width ``t``: eval mode (stacked) every cut; train
    mode (one forward per change) every cut with ``cuts="all"``, the cuts 0 and t // 2 - 1 with ``"few"`` (the
    run gate); ``"long"`` (long rows, eval mode) every 4th."""
    if cuts == "long":
        return list(range(0, t - 1, 4))
    if mode == "eval":
        return list(range(t - 1))
    return list(range(t - 1)) if cuts == "all" else sorted({0, max(0, t // 2 - 1)})


def probe_causal(model: nn.Module, batch, cfg: ModelConfig, threshold: float, mode: str = "eval", *,
                 device: torch.device | str = "cpu", dtype: str = "fp32", seed: int = 0,
                 name: str = "", cuts: str = "all", eval_passed: bool = False) -> ProbeResult:
    """For every cut c in 0..T-2, change the target after c -- other real tokens, padding, or real
    tokens where it was padded -- and require the logits at real positions <= c to stay within
    ``threshold``. Masks are made by the model from the changed ids, as in training.

    In eval mode every changed batch is stacked into one forward (rows of a correct model are
    independent). In train mode each change is its own forward with the RNG re-seeded, so dropout
    drops the same units as in the unchanged forward; ``cuts="few"`` limits train mode to the
    cuts 0 and T // 2 (the run gate's budget: every known leak shows at any cut); ``"long"``: every 4th cut
    (:func:`_cuts`).

    Args:
        batch: ``(src (B, S), tgt (B, T), labels)``; position 0 of every target row must be real.
        eval_passed: the eval-mode probe passed (a train-mode leak is then named as training-only).
    """
    device = torch.device(device)
    src, tgt = batch[0].to(device), batch[1].to(device)
    real = batch[1] != cfg.pad  # (B, T)
    b, t = tgt.shape
    model.train(mode == "train")
    base = probe_logits(model, src, tgt, None, device, dtype, mode, seed)
    if (bad := non_finite_result("causal leak", name, mode, base, real, threshold, model)) is not None:
        return bad
    g = torch.Generator().manual_seed(seed + 17)
    changes = _causal_changes(tgt, cfg, g, _cuts(t, mode, cuts))
    if mode == "eval" and changes:
        stacked = torch.cat([ch for _, _, ch in changes])  # (B * n, T)
        outs = []
        chunk = max(1, 512 // b) * b  # whole changed batches per forward: each part repeats the source
        for i in range(0, stacked.size(0), chunk):
            part = stacked[i:i + chunk]
            outs.append(probe_logits(model, src.repeat(part.size(0) // b, 1), part, None, device, dtype, mode, seed))
        outs = torch.cat(outs).split(b)
    else:
        outs = [probe_logits(model, src, ch, None, device, dtype, mode, seed) for _, _, ch in changes]
    worst, leak = 0.0, None
    for (c, kind, changed), out in zip(changes, outs):
        per_pos = _changed_positions(out, base, real, c)
        worst = max(worst, float(per_pos.max()))
        bad = (per_pos > threshold).nonzero().flatten()
        if bad.numel() and (leak is None or int(bad[0]) < leak[0]):
            leak = (int(bad[0]), c, float(per_pos[bad[0]]), kind, changed)
    model.eval()
    detail = _leak_detail(model, src, tgt, real, base, leak, mode, eval_passed, min(len(changes), 512 // b), threshold,
                          device, dtype) if leak else ""
    return ProbeResult(name, "causal leak", mode, leak is None, worst, threshold, detail)

