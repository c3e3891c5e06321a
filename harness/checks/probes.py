"""Model-level integrity probes: does any output at a real position depend on what it must not see?

Shape letters: B batch, S source length, T target length, V vocabulary.

No reference implementation is needed: each probe changes only what a correct model must ignore
and requires the logits at real positions to stay put (within ``threshold``):

* **causal** (:func:`probe_causal`): for every cut c, the target after position c is (a) redrawn
  with other real tokens, (b) replaced by padding (the target gets shorter) and (c) extended where
  it was padded (the target gets longer); logits at real positions <= c must not move. (b) and (c)
  catch a component that learns the target's length from its padding, which (a) alone cannot.
* **masked source keys** (:func:`probe_masked_keys`): the tokens at padded source positions change
  while the masks made from the original batch are kept.
* **extra source padding** (:func:`probe_extra_padding`): pad tokens appended to the source (masks
  made from the ids, as in training); logits at real target positions must not move.
* **finite** (:func:`probe_finite`): logits at real positions and every parameter's gradient of the
  loss over real positions are finite on a padded batch (a NaN at a padded row reaches the gradients).

Eval mode runs under ``torch.inference_mode`` (as evaluation does); train mode runs with autograd
on and the RNG re-seeded before every forward, so dropout drops the same units in both forwards
(probes that change shapes run in eval mode only). A model that behaves differently when it
detects a probe must therefore behave differently in training or in evaluation too.

Used by ``harness check`` (with each variant's own rounding threshold) and by every trial of
``harness run`` before and after training (:func:`integrity_reasons`, the ``invalid`` status).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from ..config import DEFAULT_PRESET, ModelConfig, get_preset
from ..errors import HarnessError
from .inputs import autocast, describe_exception, fmt_size, long_rows_of, non_pad, padded_batch, starting
from .policy import GATE_ATOL, GATE_RTOL


@dataclass
class ProbeResult:
    """One probe on one variant: the largest change where nothing may change."""

    subject: str
    probe: str
    mode: str
    passed: bool
    max_change: float
    threshold: float
    detail: str = ""


@contextlib.contextmanager
def _seeded(seed: int | None, device: torch.device):
    if seed is None:
        yield
        return
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def _logits(model, src, tgt, masks, device, dtype, mode: str, seed: int) -> torch.Tensor:
    """Logits (B, T, V) as float64 on the CPU, in ``mode`` (see the module docstring)."""
    guard = torch.inference_mode() if mode == "eval" else torch.enable_grad()
    with guard, autocast(device, dtype), _seeded(seed if mode == "train" else None, device):
        out = model(src, tgt, *masks) if masks is not None else model(src, tgt)
    return out.detach().to("cpu", torch.float64)


def _not_finite(probe: str, name: str, mode: str, base: torch.Tensor, real: torch.Tensor,
                threshold: float, model: nn.Module) -> ProbeResult | None:
    """A failed ``probe`` that names the non-finite output when the unchanged forward's logits ``base`` (B, T, V) are
    NaN or inf at the ``real`` (B, T) target positions (no change can be measured then, and a leak would be the
    wrong name), with ``model`` put back in evaluation mode; None when they are finite."""
    if bool(torch.isfinite(base[real]).all()):
        return None
    model.eval()
    return ProbeResult(name, probe, mode, False, math.inf, threshold, (
        f"non-finite output in {'training' if mode == 'train' else 'evaluation'} mode: the logits at real target "
        f"positions are NaN or inf before anything is changed, so this probe cannot measure a change (the 'finite' "
        f"probe names the first module whose output is non-finite)"))


def first_non_finite(model: nn.Module, run) -> str:
    """The first module, in the order modules finish their forward, whose output holds a NaN or inf during
    ``run()`` (the innermost culprit: a module finishes after its children), as ``"name (Class)"``; "" if none."""
    found: list[str] = []
    names = {m: n for n, m in model.named_modules()}

    def hook(module, _inputs, out):
        if not found and isinstance(out, torch.Tensor) and out.is_floating_point() and not torch.isfinite(out).all():
            found.append(f"{names.get(module) or 'the model'} ({type(module).__name__})")

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return found[0] if found else ""


def _other(ids: torch.Tensor, cfg: ModelConfig, g: torch.Generator) -> torch.Tensor:
    """Non-pad ids that differ from ``ids`` at every position (same shape)."""
    cand = non_pad(ids.shape, cfg, g).to(ids.device)
    shifted = (cand + 1) % cfg.vocab
    shifted = torch.where(shifted == cfg.pad, (shifted + 1) % cfg.vocab, shifted)
    return torch.where(cand == ids, shifted, cand)


def batch_statistics(model: nn.Module, mode: str, prefer: str = "") -> str:
    """In train mode, the cause a leak has when the model holds BatchNorm modules (their training
    statistics run over every row and position of the batch, so one position's output depends on the
    others'): a phrase naming them (first one whose name starts with ``prefer``); "" in eval mode or
    without such modules."""
    names = [n for n, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    names.sort(key=lambda n: not n.startswith(prefer))
    if mode != "train" or not names:
        return ""
    return (f"through the batch statistics of its {len(names)} BatchNorm module(s) (e.g. {names[0]}), which "
            f"normalise each feature over every position and row of the batch in training")


def _batch_dependence(model, src, tgt, base, real, copies: int, threshold: float, device, dtype) -> str:
    """The eval-mode causal probe stacks its changed targets into one forward of ``copies`` x B rows. When
    the *unchanged* batch, stacked the same way, already moves its rows' logits (at real positions, in any
    copy: a fault may touch only the rows past some index), the model's output depends on the batch it is in
    (a batch-size branch, statistics over the batch, rows treated by their index), not on the future: the
    phrase that says so, else ""."""
    if copies < 2:
        return ""
    out = _logits(model, src.repeat(copies, 1), tgt.repeat(copies, 1), None, device, dtype, "eval", 0)
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
                after.copy_(_other(after, cfg, g))
            elif kind == "padded":
                after.fill_(cfg.pad)
            else:
                after.copy_(torch.where(after == cfg.pad, _other(after, cfg, g), after))
            if not torch.equal(changed, tgt):
                out.append((c, kind, changed))
    return out


_HOW = {"redrawn": "were redrawn", "padded": "were replaced by padding (the target got shorter)",
        "extended": "replaced the padding (the target got longer)"}


#: A leak's cause when the probe leaks in train mode only (its eval-mode run passed) and no BatchNorm is in sight.
TRAIN_ONLY = ("in training only (the evaluation-mode probe passes): something that runs only in training mixes "
              "positions, such as a mask skipped in training or statistics over the batch")


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
    base = _logits(model, src, tgt, None, device, dtype, mode, seed)
    if (bad := _not_finite("causal leak", name, mode, base, real, threshold, model)) is not None:
        return bad
    g = torch.Generator().manual_seed(seed + 17)
    changes = _causal_changes(tgt, cfg, g, _cuts(t, mode, cuts))
    if mode == "eval" and changes:
        stacked = torch.cat([ch for _, _, ch in changes])  # (B * n, T)
        outs = []
        chunk = max(1, 512 // b) * b  # whole changed batches per forward: each part repeats the source
        for i in range(0, stacked.size(0), chunk):
            part = stacked[i:i + chunk]
            outs.append(_logits(model, src.repeat(part.size(0) // b, 1), part, None, device, dtype, mode, seed))
        outs = torch.cat(outs).split(b)
    else:
        outs = [_logits(model, src, ch, None, device, dtype, mode, seed) for _, _, ch in changes]
    worst, leak = 0.0, None
    for (c, kind, _), out in zip(changes, outs):
        per_pos = _changed_positions(out, base, real, c)
        worst = max(worst, float(per_pos.max()))
        bad = (per_pos > threshold).nonzero().flatten()
        if bad.numel() and (leak is None or int(bad[0]) < leak[0]):
            leak = (int(bad[0]), c, float(per_pos[bad[0]]), kind)
    model.eval()
    detail = ""
    if leak:
        p, c, x, kind = leak
        what = "target tokens after position" if kind != "extended" else "real tokens after position"
        stats = batch_statistics(model, mode, prefer="decoder")
        if not stats and mode == "train" and eval_passed:
            stats = TRAIN_ONLY
        batch = _batch_dependence(model, src, tgt, base, real, min(len(changes), 512 // b), threshold, device,
                                  dtype) if mode == "eval" and not stats else ""
        detail = (f"decoder position {p} changed (max |Δ logit| {fmt_size(x)}) when the {what} {c} {_HOW[kind]} "
                  f"({mode} mode): " + (batch if batch else "it sees the future "
                  + (stats if stats else "through the padding (e.g. the target's length)" if kind != "redrawn" else
                     "(causal mask not applied or shifted)")))
    return ProbeResult(name, "causal leak", mode, leak is None, worst, threshold, detail)


def probe_masked_keys(model: nn.Module, batch, cfg: ModelConfig, threshold: float, mode: str = "eval", *,
                      device: torch.device | str = "cpu", dtype: str = "fp32", seed: int = 0,
                      name: str = "", eval_passed: bool = False) -> ProbeResult:
    """Change the tokens at padded source positions, keeping the masks made from the original batch;
    logits at real target positions must not move (encoder self-attention and cross-attention).
    ``eval_passed``: as :func:`probe_causal`'s."""
    device = torch.device(device)
    src, tgt = batch[0].to(device), batch[1].to(device)
    real = batch[1] != cfg.pad
    model.train(mode == "train")
    masks = model.make_masks(src, tgt)
    base = _logits(model, src, tgt, masks, device, dtype, mode, seed)
    if (bad := _not_finite("masked source keys", name, mode, base, real, threshold, model)) is not None:
        return bad
    changed = src.clone()
    padded = src == cfg.pad
    changed[padded] = _other(src, cfg, torch.Generator().manual_seed(seed + 29))[padded]
    out = _logits(model, changed, tgt, masks, device, dtype, mode, seed)
    model.eval()
    d = torch.nan_to_num((out - base).abs(), nan=math.inf).masked_fill(~real[..., None], 0.0)
    worst = float(d.max())
    detail = ""
    if worst > threshold:
        stats = batch_statistics(model, mode)
        cause = (f"the padding reaches them {stats}" if stats else TRAIN_ONLY if mode == "train" and eval_passed
                 else "source padding mask not applied")
        detail = (f"real target positions changed (max |Δ logit| {fmt_size(worst)}) when the tokens at padded "
                  f"source positions changed, masks unchanged ({mode} mode): {cause}")
    return ProbeResult(name, "masked source keys", mode, worst <= threshold, worst, threshold, detail)


def probe_extra_padding(model: nn.Module, batch, cfg: ModelConfig, threshold: float, *,
                        device: torch.device | str = "cpu", dtype: str = "fp32", extra: int = 3,
                        name: str = "") -> ProbeResult:
    """Append ``extra`` pad tokens to every source row (masks made from the ids); logits at real target
    positions must not move. Eval mode (the shapes change, so dropout draws would differ)."""
    device = torch.device(device)
    src, tgt = batch[0].to(device), batch[1].to(device)
    real = batch[1] != cfg.pad
    if src.size(1) + extra > cfg.max_len:
        extra = max(0, cfg.max_len - src.size(1))
    model.eval()
    base = _logits(model, src, tgt, None, device, dtype, "eval", 0)
    longer = torch.cat([src, torch.full((src.size(0), extra), cfg.pad, dtype=src.dtype, device=device)], dim=1)
    out = _logits(model, longer, tgt, None, device, dtype, "eval", 0)
    d = torch.nan_to_num((out - base).abs(), nan=math.inf).masked_fill(~real[..., None], 0.0)
    worst = float(d.max())
    detail = "" if worst <= threshold else (
        f"real target positions changed (max |Δ logit| {fmt_size(worst)}) when {extra} pad tokens were appended to the "
        f"source (eval mode): padded source keys are attended to (source padding ignored)")
    return ProbeResult(name, "extra source padding", "eval", worst <= threshold, worst, threshold, detail)


def probe_prefix(model: nn.Module, batch, cfg: ModelConfig, threshold: float, *,
                 device: torch.device | str = "cpu", dtype: str = "fp32", name: str = "",
                 causal_passed: bool = True) -> ProbeResult:
    """Prefix = whole target, eval mode: for every target position t, the logits at t from a forward whose
    decoder input is the prefix ``tgt[:, :t + 1]`` (width t + 1: how held-out positions are scored,
    :func:`harness.tasks.base.prefix_logits`) must equal the whole-target forward's at real positions.
    Every other probe keeps the target's width, so a component that reads the decoder input's width (a
    branch on a single query, a scale by the length) passed them, trained as one function and was scored
    as another (``tests/plugins/adv_single_query_scale.py``). One forward per position, every row in each.
    ``causal_passed``: the eval-mode causal probe passed (else a gap is named as that leak: the whole-target
    forward sees later tokens)."""
    device = torch.device(device)
    src, tgt = batch[0].to(device), batch[1].to(device)
    real = batch[1] != cfg.pad  # (B, T)
    model.eval()
    base = _logits(model, src, tgt, None, device, dtype, "eval", 0)  # (B, T, V)
    worst, first = 0.0, None
    for t in range(tgt.size(1)):
        if not bool(real[:, t].any()):
            continue
        out = _logits(model, src, tgt[:, :t + 1], None, device, dtype, "eval", 0)[:, t]  # (B, V)
        d = float(torch.nan_to_num((out - base[:, t]).abs(), nan=math.inf)[real[:, t]].max())
        worst = max(worst, d)
        if d > threshold and first is None:
            first = (t, d)
    detail = "" if first is None else (
        f"the logits at target position {first[0]} from a decoder input that ends there (width {first[0] + 1}, "
        f"how held-out positions are scored) differ from the whole-target forward's by {fmt_size(first[1])} (eval "
        f"mode): " + ("an output depends on the decoder input's width (e.g. a branch on a single query, a scale by "
                      "the length), so the model trains as one function and is scored as another" if causal_passed else
                      "the whole-target forward sees later target tokens (the causal leak above)"))
    return ProbeResult(name, "prefix = whole target", "eval", first is None, worst, threshold, detail)


def probe_finite(model: nn.Module, batch, cfg: ModelConfig, *, device: torch.device | str = "cpu",
                 dtype: str = "fp32", name: str = "") -> ProbeResult:
    """Logits at real target positions and every parameter's gradient of the cross-entropy over real
    positions must be finite on a padded batch (train mode). Gradients are cleared afterwards."""
    device = torch.device(device)
    src, tgt, labels = (t.to(device) for t in batch)
    real = tgt != cfg.pad
    model.train()
    model.zero_grad(set_to_none=True)
    with torch.enable_grad(), autocast(device, dtype):
        logits = model(src, tgt)
        loss = F.cross_entropy(logits[real].float(), labels[real])
    detail = ""
    if not torch.isfinite(logits[real]).all():
        with torch.no_grad(), autocast(device, dtype):
            where = first_non_finite(model, lambda: model(src, tgt))
        detail = ("non-finite output in training mode: logits at real target positions are NaN or inf on a padded "
                  "batch" + (f"; first non-finite output: {where}" if where else ""))
    else:
        loss.backward()
        bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
        if bad:
            where = "" if torch.isfinite(logits).all() else " (the logits at padded positions are NaN: " \
                                                            "a fully masked row there reaches the gradients)"
            detail = f"non-finite gradient in {len(bad)} parameter(s), e.g. {bad[0]}, on a padded batch{where}"
    model.zero_grad(set_to_none=True)
    model.eval()
    return ProbeResult(name, "finite", "train", not detail, 0.0 if not detail else math.inf, 0.0, detail)


def run_probes(model: nn.Module, batch, cfg: ModelConfig, threshold: float, *, device="cpu", dtype: str = "fp32",
               seed: int = 0, name: str = "", cuts: str = "all", long=None, prefix: bool = True,
               task=None) -> list[ProbeResult]:
    """Every probe of this module: finite, then causal and masked source keys in eval and train mode,
    then extra source padding and (with ``prefix``) prefix = whole target, on ``batch``; with ``long`` (rows as long as ``max_len``:
    :func:`~harness.checks.inputs.long_rows_of`) one more eval-mode causal probe on those rows alone
    (probe ``"causal leak (long rows)"``, every 4th cut: a mask that leaks only from some position on);
    with ``task`` (rows drawn by the task that trains: :func:`task_rows`) the eval-mode causal probe (every 4th
    cut) and masked source keys on them too (``"... (task rows)"``: a component that branches on what real
    data looks like, such as which ids a source holds, shows there what the drawn rows hide).
    ``cuts``: see :func:`probe_causal`."""
    kw = dict(device=device, dtype=dtype, name=name)
    out = [probe_finite(model, batch, cfg, **kw)]
    causal = probe_causal(model, batch, cfg, threshold, "eval", seed=seed, cuts=cuts, **kw)
    keys = probe_masked_keys(model, batch, cfg, threshold, "eval", seed=seed, **kw)
    out += [causal, keys,
            probe_causal(model, batch, cfg, threshold, "train", seed=seed, cuts=cuts, eval_passed=causal.passed, **kw),
            probe_masked_keys(model, batch, cfg, threshold, "train", seed=seed, eval_passed=keys.passed, **kw)]
    out.append(probe_extra_padding(model, batch, cfg, threshold, **kw))
    if prefix:
        out.append(probe_prefix(model, batch, cfg, threshold, causal_passed=causal.passed, **kw))
    if long is not None:
        r = probe_causal(model, long, cfg, threshold, "eval", seed=seed, cuts="long", **kw)
        out.append(dataclasses.replace(r, probe=LONG_ROWS_PROBE))
    if task is not None:
        for r in (probe_causal(model, task, cfg, threshold, "eval", seed=seed, cuts="long", **kw),
                  probe_masked_keys(model, task, cfg, threshold, "eval", seed=seed, **kw)):
            out.append(dataclasses.replace(r, probe=f"{r.probe} (task rows)",
                                           detail=f"on rows the task drew: {r.detail}" if r.detail else ""))
    return out


#: Rows :func:`task_rows` draws: enough for padded and full rows of every length the task draws.
TASK_ROWS = 8


def task_rows(task, seq_len: int, cfg: ModelConfig, seed: int = 0):
    """:data:`TASK_ROWS` rows drawn by ``task`` (its ``make_batch`` from a generator of its own: the trial's random
    streams are not touched) as ``(src (B, S), tgt (B, T), tgt_y (B, T))``, for :func:`run_probes`'s task-row
    probes; None when the task cannot draw them (the drawn-row probes still run)."""
    try:
        b = task.make_batch(TASK_ROWS, seq_len, cfg.vocab, torch.Generator().manual_seed(seed + 7919))
        rows = (b.src, b.tgt, b.tgt_y)
    except Exception:  # noqa: BLE001 - a task that cannot draw probe rows loses these probes, nothing else
        return None
    fits = max(x.size(1) for x in rows) <= cfg.max_len and max(int(x.max()) for x in rows) < cfg.vocab
    return rows if fits and bool((rows[1][:, 0] != cfg.pad).all()) else None


def preset_task_rows(registry, preset: str | None, cfg: ModelConfig, seed: int = 0):
    """:func:`task_rows` of ``preset``'s task (:data:`harness.config.DEFAULT_PRESET`'s without one) at ``cfg``'s
    vocabulary and ``preset``'s ``train.seq_len``: what ``check`` probes beside its drawn batch. None when that task
    is not registered or cannot draw rows this model takes."""
    train = get_preset(preset or DEFAULT_PRESET).train
    try:
        task = registry.task(train.task)
    except HarnessError:
        return None
    return task_rows(task, train.seq_len, cfg, seed)


#: The probe name of :func:`run_probes`'s causal probe on the long rows.
LONG_ROWS_PROBE = "causal leak (long rows)"


# --------------------------------------------------------------------------- the run gate

def gate_batch(cfg: ModelConfig, rows: int = 6, src_len: int = 9, tgt_len: int = 10, seed: int = 0,
               long_rows: int = 2):
    """The run gate's padded batch: ``(src (B, S), tgt (B, T), labels (B, T))``; target rows start
    with the start symbol 1 when the vocabulary has one, row i < ``rows`` ends with min(i, L - 2) pad tokens,
    and ``long_rows`` more as long as ``max_len`` (up to :data:`~harness.checks.policy.LONGEST_ROW`;
    :func:`~harness.checks.inputs.padded_batch`), so
    every gate item also sees the positions a long training row reaches."""
    s, t = min(src_len, cfg.max_len - 3), min(tgt_len, cfg.max_len)
    return starting(padded_batch(cfg, rows, s, t, seed=seed, long_rows=long_rows), cfg)


def integrity_reasons(model: nn.Module, cfg: ModelConfig, device, *, seed: int = 0, when: str = "",
                      task=None) -> list[str]:
    """The run gate: every probe of :func:`run_probes` on :func:`gate_batch`, in float32, but prefix = whole
    target (a trial compares prefix-only and whole-target logits on held-out rows at every evaluation:
    :func:`harness.tasks.base.future_leak`); with ``task`` (:func:`task_rows`) also the task-row probes.
    Returns one line per failed probe (empty: the model passes). Threshold: ``GATE_ATOL + GATE_RTOL * max |logit|``
    (:mod:`harness.checks.policy`).
    The model's training mode is restored, its gradients cleared, its weights, its buffers (a BatchNorm's
    running statistics, which the train-mode probes' forwards would update) and the global RNG state
    left unchanged."""
    device = torch.device(device)
    batch = gate_batch(cfg, seed=seed)
    was_training = model.training
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    devices = [device.index or 0] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices), torch.inference_mode():
            model.eval()
            scale = float(torch.nan_to_num(model(batch[0].to(device), batch[1].to(device)).abs().max(), nan=0.0))
        thr = GATE_ATOL + GATE_RTOL * scale
        with torch.random.fork_rng(devices=devices):  # the trial's own RNG stream is left as it was
            results = run_probes(model, gate_batch(cfg, seed=seed, long_rows=0), cfg, thr, device=device, seed=seed,
                                 cuts="few", long=long_rows_of(batch, 6), prefix=False, task=task)
    except Exception as exc:  # noqa: BLE001 - the trial itself will fail with its own message
        return [f"probes crash{' ' + when if when else ''}: {describe_exception(exc)}"]
    finally:
        model.train(was_training)
        with torch.no_grad():
            for b, before in buffers:
                b.copy_(before)
    prefix = f"{when}: " if when else ""
    seen, out = set(), []
    for r in results:
        if not r.passed and r.probe not in seen:
            seen.add(r.probe)
            out.append(prefix + r.detail)
    return out
