"""One training loop for every variant, and the trial function every executor calls.

A *trial* is one variant x one seed x one config on one device. :func:`run_trial` takes a
plain dict (so the same function serves in-process, process-pool and Ray execution) and
returns a dict with the trial's metrics row and its loss curve.

Training (identical for every variant): Adam(beta = (0.9, 0.98), eps = 1e-9) (Vaswani et al.
2017 §5.3; PyTorch's fused implementation where the device supports it, same update rule)
with the Noam schedule through ``LambdaLR`` (the Annotated Transformer's ``rate``:
lr * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), step counted from 1);
``F.cross_entropy(..., ignore_index=pad, label_smoothing=eps)`` in float32 (note: PyTorch
spreads eps over all V classes, the Annotated ``LabelSmoothing`` over V - 2); greedy decoding
for exact-match. ``dtype="bf16"`` runs the forward pass under
``torch.autocast(device, torch.bfloat16)``: matmuls in bfloat16, parameters, optimizer state,
the residual stream of every built-in variant and the loss in float32.

Process-wide settings every trial (and ``harness bench``) applies, see :func:`trial_settings`:
deterministic algorithms, denormals flushed to zero on CPU, no NaN-filling of fresh memory.
"""
from __future__ import annotations

import contextlib
import math
import os
import platform
import re
import resource
import time
import traceback
from typing import Any, Callable

import torch
from torch.autograd.profiler import record_function
from torch.nn import functional as F

from .config import RunConfig
from .errors import DeviceError
from .model import build_model, unique_parameter_count
from .probes import integrity_reasons
from .registry import Variant
from .tasks.base import START, Batch, Task

#: Names of the ``torch.profiler.record_function`` ranges that mark a trial's phases (about
#: 10 us each when no profiler runs). ``step`` is the model's own work; every other phase is the
#: harness's overhead (what each covers: :data:`harness.overhead.PHASE_NOTES`).
PHASES = {k: f"harness.{k}" for k in ("build", "data", "step", "log", "evaluate", "final_eval", "store")}


class PhaseClock:
    """Wall time and count per phase of a trial (:data:`PHASES`), summed with
    ``time.perf_counter`` around the same blocks that carry the ``record_function`` ranges.

    ``with clock("data"): ...`` times the block (seconds) and marks it for ``torch.profiler``;
    it costs a few microseconds per block. The phase sums need no profiler, so every trial
    records them (the ``overhead_share`` column) and ``harness profile`` can read them for a
    trial of any length; ``harness profile --torch-profiler`` cross-checks them against the
    profiler's own ranges.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {k: 0.0 for k in PHASES}
        self.calls: dict[str, int] = {k: 0 for k in PHASES}

    @contextlib.contextmanager
    def __call__(self, name: str):
        with record_function(PHASES[name]):
            t0 = time.perf_counter()
            try:
                yield
            finally:
                self.seconds[name] += time.perf_counter() - t0
                self.calls[name] += 1

    def to_dict(self) -> dict[str, dict[str, float]]:
        """``{phase: {"s": seconds, "calls": n}}``."""
        return {k: {"s": self.seconds[k], "calls": self.calls[k]} for k in PHASES}

SOLVED = 0.99  #: exact-match threshold for "solved" (time/steps to solve)
PROBE_SEQUENCES = 200  #: held-out sequences scored at each periodic evaluation

#: What :func:`trial_settings` sets, as reported in :func:`environment`.
TRIAL_SETTINGS = {
    "deterministic_algorithms": "on (warn_only)",
    "flush_denormal": "on (CPU: subnormal floats read and written as 0)",
    "fill_uninitialized_memory": "off",
    "optimizer": "Adam fused=True where supported, else foreach=True",
}


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda when available else cpu. Raises DeviceError for unavailable cuda."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise DeviceError("--device cuda requested but CUDA is not available here (use --device cpu or auto)")
    if name not in ("cpu",) and not name.startswith("cuda"):
        raise DeviceError(f"unknown device {name!r} (use auto, cpu or cuda)")
    return torch.device(name)


def trial_settings() -> None:
    """Apply the process-wide settings of :data:`TRIAL_SETTINGS` (idempotent, cheap).

    * ``torch.use_deterministic_algorithms(True, warn_only=True)``.
    * ``torch.utils.deterministic.fill_uninitialized_memory = False``: deterministic mode
      otherwise NaN-fills every new tensor (a debugging aid that costs a memory pass per
      allocation, about 2 % of a step); correct code never reads uninitialised memory.
    * ``torch.set_flush_denormal(True)`` (CPU): subnormal floats (|x| < 1.2e-38) are treated
      as 0. Adam's second moment of tiny bf16-autocast gradients turns subnormal, and x86
      handles subnormals in microcode: the optimizer step was 2-4x slower without it.
      Values that small are far below Adam's eps = 1e-9 and never change an update.
    """
    torch.use_deterministic_algorithms(True, warn_only=True)
    import torch.utils.deterministic as _det

    _det.fill_uninitialized_memory = False
    torch.set_flush_denormal(True)


def noam_lambda(d_model: int, warmup: int, schedule: str = "noam") -> Callable[[int], float]:
    """The multiplier LambdaLR applies to the base lr at scheduler step ``step`` (0-based).

    ``noam``: d_model^-0.5 * min(s^-0.5, s * warmup^-1.5) with s = max(step, 1) (Annotated ``rate``).
    ``constant``: d_model^-0.5 (no warm-up; Xiong et al. 2020's no-warmup arm uses a fixed lr).
    """
    if schedule == "constant":
        return lambda step: d_model ** -0.5

    def rate(step: int) -> float:
        step = max(step, 1)
        return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)

    return rate


def _autocast(device: torch.device, dtype: str):
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=(dtype == "bf16"))


def loss_fn(logits: torch.Tensor, labels: torch.Tensor, pad: int, smoothing: float) -> torch.Tensor:
    """Mean cross-entropy over non-pad labels. logits (B, T, V) (cast to float32), labels (B, T)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), labels.reshape(-1),
                           ignore_index=pad, label_smoothing=smoothing)


def make_optimizer(model: torch.nn.Module, cfg: RunConfig):
    """Adam(betas=(0.9, 0.98), eps=1e-9) and the LambdaLR schedule of ``cfg`` (Vaswani §5.3).

    Uses ``fused=True`` (one kernel per parameter; on CPU 2x faster than ``foreach``) and
    falls back to ``foreach=True`` where the device or a parameter's dtype has no fused kernel.

    Returns:
        ``(optimizer, scheduler)``.
    """
    tc = cfg.train
    kwargs = dict(lr=tc.lr, betas=(0.9, 0.98), eps=1e-9)
    params = list(model.parameters())
    try:
        opt = torch.optim.Adam(params, fused=True, **kwargs)
    except (RuntimeError, ValueError):  # no fused kernel for this device / dtype
        opt = torch.optim.Adam(params, foreach=True, **kwargs)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, noam_lambda(cfg.model.d_model, tc.warmup, tc.schedule))
    return opt, sched


def train_step(model, batch: Batch, opt, sched, cfg: RunConfig, device: torch.device, dtype: str = "fp32",
               clock: Callable[[str], None] | None = None) -> tuple[float, float]:
    """One optimizer step on ``batch`` (already on ``device``); the step the loop and the bench share.

    Gradients cleared (set to None); forward (under autocast for ``bf16``) and float32 loss; backward; global gradient norm
    (clipped to ``train.grad_clip`` when > 0); Adam and scheduler step, skipped when the
    loss or the gradient norm is not finite.

    Args:
        clock: optional ``clock(phase)`` called after ``"forward"`` (loss included),
            ``"backward"`` and ``"optimizer"`` (gradient norm, Adam, scheduler); the bench
            uses it to time the phases.

    Returns:
        ``(loss, grad_norm)`` as Python floats (loss in nats/token).
    """
    tc, pad = cfg.train, cfg.model.pad
    opt.zero_grad(set_to_none=True)  # before the forward: the old gradients never coexist with activations
    with _autocast(device, dtype):
        logits = model(batch.src, batch.tgt)
    loss = loss_fn(logits, batch.tgt_y, pad, tc.label_smoothing)
    if clock:
        clock("forward")
    loss.backward()
    if clock:
        clock("backward")
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if tc.grad_clip > 0:
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
    else:  # the norm only (divergence check), without clip_grad_norm_'s multiply by 1.0
        gnorm = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())
    loss_v, gnorm_v = float(loss.detach()), float(gnorm)
    if math.isfinite(loss_v) and math.isfinite(gnorm_v):
        opt.step()
        sched.step()
    if clock:
        clock("optimizer")
    return loss_v, gnorm_v


@torch.no_grad()
def greedy_exact_match(model, src: torch.Tensor, tgt_y: torch.Tensor, pad: int, start: int = START,
                       memory: torch.Tensor | None = None) -> torch.Tensor:
    """Per-sequence exact match of greedy decoding, decoding only sequences still undecided.

    Makes the same decisions as ``exact_match(greedy_decode(model, src, T), tgt_y)`` from
    :mod:`harness.tasks.copy` (Annotated ``greedy_decode``): a sequence fails at its first
    wrong token at a non-pad label position and passes once every non-pad label is produced
    (later positions are not scored). Each decoding step drops the sequences that are
    decided, so the decoder runs on fewer rows: about 2.5x less work for a model that has
    learnt the variable-length copy task. Rows are independent in every correctly masked
    variant, so the outcome does not depend on which rows share a batch (up to float
    rounding, as with any change of batch size).

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

#: How exact-match accuracy was computed (the ``exact_match_method`` column). The final exact match
#: is always greedy decoding; the periodic evaluations (steps to solve) read it off the teacher-forced
#: pass when the integrity probes passed at initialisation (see :func:`evaluate`).
EM_TEACHER_FORCED = "greedy decoding (final); periodic: teacher-forced (probes passed at initialisation)"
EM_GREEDY = "greedy decoding"

#: Trial status of a variant that fails an integrity probe (:func:`harness.probes.integrity_reasons`)
#: at initialisation or after training: it still trains, its numbers are stored, and no report ranks it.
INVALID = "invalid"


def eval_chunk(cfg: RunConfig, positions: int | None = None) -> int:
    """Sequences per evaluation chunk: at most 500 (larger chunks were no faster per sequence
    at d_model = 64), fewer for wide models so that evaluation does not raise the trial's peak
    memory above training's (170 for the ``paper`` preset), never fewer than the training batch.

    Args:
        positions: the longest row of the evaluation data (default ``seq_len + 2``)."""
    width = max(cfg.model.d_ff, cfg.model.d_model, cfg.model.vocab)
    positions = positions or cfg.train.seq_len + 2
    return max(cfg.train.batch, min(500, EVAL_CHUNK_ELEMENTS // (positions * width)))


@torch.inference_mode()
def evaluate(model, data: Batch, cfg: RunConfig, device, dtype: str, chunk: int | None = None,
             causal: bool = False) -> dict[str, float]:
    """Held-out metrics on ``data``: unsmoothed cross-entropy (nats/token), token accuracy
    (teacher forcing) and exact-match accuracy of greedy decoding (fraction of sequences), in
    chunks of ``chunk`` sequences (default :func:`eval_chunk`).

    Exact match: with ``causal=True`` (the caller ran :func:`harness.probes.integrity_reasons`) it is read off the
    teacher-forced pass (every non-pad label position's argmax right), which for a causal decoder is
    the same event as greedy decoding getting every label right (up to float rounding at argmax
    near-ties: the two paths multiply matrices of different shapes); otherwise by greedy decoding
    (:func:`greedy_exact_match`)."""
    chunk = chunk or eval_chunk(cfg, max(data.src.size(1), data.tgt.size(1) + 1))
    was_training = model.training
    model.eval()
    pad = cfg.model.pad
    tot_loss = tot_tok = tot_correct = tot_exact = 0.0
    n = data.src.size(0)
    for i in range(0, n, chunk):
        b = Batch(data.src[i:i + chunk], data.tgt[i:i + chunk], data.tgt_y[i:i + chunk]).to(device)
        keep = b.tgt_y != pad
        with _autocast(device, dtype):  # model(src, tgt), keeping the memory for greedy decoding
            src_mask, tgt_mask = model.make_masks(b.src, b.tgt)
            memory = model.encode(b.src, src_mask)  # (B, S, D)
            logits = model.embed.logits(model.decode(memory, src_mask, b.tgt, tgt_mask))  # (B, T, V)
            right = logits.argmax(-1) == b.tgt_y  # (B, T)
            if causal:
                exact = (right | ~keep).all(dim=1)  # (B,)
            else:
                exact = greedy_exact_match(model, b.src, b.tgt_y, pad, memory=memory)
        ntok = int(keep.sum())
        tot_loss += float(loss_fn(logits, b.tgt_y, pad, 0.0)) * ntok
        tot_tok += ntok
        tot_correct += float((right & keep).sum())
        tot_exact += float(exact.sum())
    model.train(was_training)
    return {"heldout_ce": tot_loss / tot_tok, "heldout_token_acc": tot_correct / tot_tok,
            "exact_match": tot_exact / n}


def reset_peak_mem(device: torch.device) -> None:
    """Start a new peak-memory window: CUDA ``reset_peak_memory_stats``; CPU (Linux) resets
    the process's peak resident set size (``echo 5 > /proc/self/clear_refs``)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_mem_mb(device: torch.device) -> float:
    """Peak memory since :func:`reset_peak_mem`, MiB.

    CUDA: ``torch.cuda.max_memory_allocated`` (tensors only). CPU: the process's peak
    resident set size (``VmHWM``; the Python interpreter and torch's libraries included,
    about 300 MiB); where ``/proc`` is missing, ``ru_maxrss`` (the peak over the process's life).
    """
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        with open("/proc/self/status") as f:
            m = re.search(r"^VmHWM:\s+(\d+)\s+kB", f.read(), re.M)
        if m:
            return int(m.group(1)) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def train(model, cfg: RunConfig, seed: int, device: torch.device, dtype: str = "fp32",
          progress: Callable[[int, float], None] | None = None,
          clock: PhaseClock | None = None, task: Task | None = None) -> tuple[dict[str, Any], list[dict]]:
    """Train ``model`` on ``task`` (default: the registered task named ``cfg.train.task``);
    returns (metrics, curve).

    The curve holds one ``{"step", "split": "train", "loss"}`` row per step and one
    ``{"step", "split": "heldout", "loss", "exact_match", "wall_s"}`` row per evaluation.
    Stops early with status ``diverged`` when the loss or the gradient norm is not finite.

    Timing: ``train_s`` (and a curve row's ``wall_s``) is the wall time of the training steps
    -- batch generation, forward, backward, optimizer, the ``progress`` callback -- with every
    held-out evaluation excluded. ``time_to_solve_s`` is ``train_s`` at the first evaluation
    with exact-match >= :data:`SOLVED` (a periodic one on :data:`PROBE_SEQUENCES` sequences,
    else the final one on ``eval_sequences``); ``tokens_per_s`` = label tokens / ``train_s``.

    Integrity gate (:func:`harness.probes.integrity_reasons`): before the first step and after the
    last, the model must pass the probes (causal with the target redrawn, shortened and extended;
    source padding; finite gradients). A model that fails is trained all the same (its numbers are
    visible) but gets status :data:`INVALID` with the reasons, so that no report ranks it.

    Exact match: the final one is always greedy decoding. Periodic evaluations read it off the
    teacher-forced pass when the probes passed at initialisation (``exact_match_method``), else
    they decode greedily too.
    """
    tc, mc = cfg.train, cfg.model
    if task is None:
        task = _registry(None).task(tc.task)
    task.validate(cfg)
    clock = clock or PhaseClock()
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    probe = task.eval_set(PROBE_SEQUENCES, tc.seq_len, mc.vocab, tc.eval_seed + 1)
    opt, sched = make_optimizer(model, cfg)
    with clock("evaluate"):
        invalid = integrity_reasons(model, mc, device, seed=seed, when="at initialisation")
    causal = not invalid
    curve: list[dict] = []
    status, reason = "ok", ""
    tokens = 0
    solved_step = solved_s = None
    train_s = 0.0
    first_losses: list[float] = []
    model.train()
    t0 = time.perf_counter()
    step = 0
    for step in range(1, tc.steps + 1):
        with clock("data"):
            batch = task.make_batch(tc.batch, tc.seq_len, mc.vocab, gen).to(device)
        with clock("step"):
            loss_v, gnorm_v = train_step(model, batch, opt, sched, cfg, device, dtype)
        with clock("log"):
            curve.append({"step": step, "split": "train", "loss": loss_v})
            finite = math.isfinite(loss_v) and math.isfinite(gnorm_v)
            if finite:
                tokens += batch.ntokens
                if step <= 10:
                    first_losses.append(loss_v)
                if progress:
                    progress(step, loss_v)
        if not finite:
            status = "diverged"
            reason = f"non-finite {'loss' if not math.isfinite(loss_v) else 'gradient norm'} at step {step}"
            break
        if tc.eval_every and step % tc.eval_every == 0 and step < tc.steps:
            train_s += time.perf_counter() - t0
            with clock("evaluate"):
                m = evaluate(model, probe, cfg, device, dtype, causal=causal)
            curve.append({"step": step, "split": "heldout", "loss": m["heldout_ce"],
                          "exact_match": m["exact_match"], "wall_s": train_s})
            t0 = time.perf_counter()
            if solved_step is None and m["exact_match"] >= SOLVED:
                solved_step, solved_s = step, train_s
                if tc.stop_at_solved:
                    break
    train_s += time.perf_counter() - t0
    with clock("final_eval"):
        final = evaluate(model, task.eval_set(tc.eval_sequences, tc.seq_len, mc.vocab, tc.eval_seed),
                         cfg, device, dtype, causal=False)
        if status == "ok":
            invalid += integrity_reasons(model, mc, device, seed=seed + 1, when="after training")
    if status == "ok" and not all(math.isfinite(v) for v in final.values()):
        status, reason = "diverged", "non-finite held-out metrics"
    if invalid:
        status, reason = INVALID, "; ".join(list(dict.fromkeys(invalid)) + ([reason] if reason else []))
    curve.append({"step": step, "split": "heldout", "loss": final["heldout_ce"],
                  "exact_match": final["exact_match"], "wall_s": train_s})
    if solved_step is None and final["exact_match"] >= SOLVED:
        solved_step, solved_s = step, train_s
    train_losses = [r["loss"] for r in curve if r["split"] == "train"]
    metrics = {
        "steps": step,
        "early_loss": sum(first_losses) / len(first_losses) if first_losses else float("nan"),
        "final_train_loss": sum(train_losses[-10:]) / max(1, len(train_losses[-10:])),
        **final,
        "steps_to_solve": solved_step if solved_step is not None else float("nan"),
        "time_to_solve_s": solved_s if solved_s is not None else float("nan"),
        "train_s": train_s,
        "tokens_per_s": tokens / train_s if train_s > 0 else float("nan"),
        "exact_match_method": EM_TEACHER_FORCED if causal else EM_GREEDY,
        "status": status,
        "reason": reason,
    }
    return metrics, curve


def environment(device: torch.device | str = "cpu", trial_settings_applied: bool | None = None) -> dict[str, Any]:
    """Versions, threads, CPU features and flags that can move results (Bouthillier et al. 2021).

    ``trial_settings_applied``: whether the work this block describes runs under
    :func:`trial_settings` (``run``'s trials do, in whatever process runs them); default:
    whether this process has applied them. ``deterministic`` and ``trial_settings`` report it.
    """
    applied = torch.are_deterministic_algorithms_enabled() if trial_settings_applied is None \
        else trial_settings_applied
    import subprocess

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(__file__), timeout=5).stdout.strip() or "unknown"
    except Exception:  # noqa: BLE001
        commit = "unknown"
    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_flags": " ".join(_cpu_flags()) or "unknown",
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "device": str(device),
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32 if torch.cuda.is_available() else None,
        "deterministic": applied,
        "trial_settings": ("; ".join(f"{k}: {v}" for k, v in TRIAL_SETTINGS.items()) if applied
                           else "not applied (torch defaults: deterministic algorithms off)"),
        "git_commit": commit,
    }
    return env


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


#: CPU features that decide matmul speed (x86 ``/proc/cpuinfo`` names)
_SPEED_FLAGS = ("fma", "avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_tile", "amx_bf16")


def _cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return [fl for fl in _SPEED_FLAGS if fl in have]
    except OSError:
        pass
    return []


_REGISTRIES: dict[str, Any] = {}
_CONTRACTS: dict[tuple, list[str]] = {}


def contract_reasons(registry, variant: Variant, model_cfg) -> list[str]:
    """One line per component of ``variant`` that breaks its slot's contract (an undeclared
    difference from the slot's reference, see :mod:`harness.contracts`), checked with the trial's
    model config; cached per process. Declared differences pass; declared bugs are reported."""
    from .contracts import check_components

    out = []
    for slot, name in sorted(variant.resolved().items()):
        key = (slot, name, id(registry), repr(model_cfg))
        if key not in _CONTRACTS:
            _CONTRACTS[key] = [r.reason() for r in check_components(registry, [(slot, name)], model_cfg)
                               if not r.ok]
        out += [f"contract: {line}" for line in _CONTRACTS[key]]
    return out


def _registry(plugins: dict | None):
    import json

    from .plugins import PluginSpec
    from .registry import Registry

    key = json.dumps(plugins or {}, sort_keys=True)
    if key not in _REGISTRIES:
        _REGISTRIES[key] = Registry.from_plugins(PluginSpec.from_dict(plugins))
    return _REGISTRIES[key]


def run_trial(spec: dict[str, Any], progress: Callable[[int, float], None] | None = None,
              clock: PhaseClock | None = None) -> dict[str, Any]:
    """Run one trial from a plain dict; never raises for a failing trial.

    Args:
        spec: ``{"variant": str, "slots": {slot: component}, "config": RunConfig.to_dict(),
            "seed": int, "device": "cpu"|"cuda"|"auto", "dtype": "fp32"|"bf16",
            "plugins": PluginSpec.to_dict(), "threads": int | None, "point": str}``.
            ``threads`` pins ``torch.set_num_threads`` (results are bitwise reproducible for
            the same seed, config, device and threads); it is recorded in the row.
        progress: optional ``progress(step, loss)`` callback.
        clock: the :class:`PhaseClock` to time the phases with (default: a new one).

    Returns:
        ``{"row": {...metrics...}, "curve": [...], "phases": PhaseClock.to_dict()}``; a trial
        that raises gets status ``failed`` and the exception as its reason (an out-of-memory
        error included). ``row["overhead_share"]`` = 1 - step seconds / ``wall_s``: the share
        of the trial's wall time spent outside the model's own steps (issue 6 target <= 5%).
    """
    trial_settings()  # process-wide, once: the first call imports torch._inductor (~1.3 s), not the trial's time
    clock = clock or PhaseClock()
    t_start = time.perf_counter()
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    # cuBLAS is deterministic only with a fixed workspace; read when its handle is created
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    cfg = RunConfig.from_dict(spec["config"])
    slots = dict(spec.get("slots") or {})
    row: dict[str, Any] = {"variant": spec["variant"], **{f"slot_{k}": v for k, v in sorted(slots.items())},
                           "seed": spec["seed"], "device": "", "dtype": spec.get("dtype", "fp32"),
                           "threads": torch.get_num_threads(), "point": spec.get("point", "")}
    curve: list[dict] = []
    try:
        device = resolve_device(spec.get("device", "auto"))
        row["device"] = device.type
        if device.type == "cuda":
            torch.backends.cudnn.benchmark = False
        registry = _registry(spec.get("plugins"))
        task = registry.task(cfg.train.task)
        variant = Variant(spec["variant"], slots)
        row.update({f"slot_{k}": v for k, v in variant.resolved().items()})
        with clock("build"):  # the model, and its components held to their slots' contracts
            model = build_model(registry, variant, cfg.model, seed=spec["seed"]).to(device)
            broken = contract_reasons(registry, variant, cfg.model)
        row["params"] = unique_parameter_count(model)
        reset_peak_mem(device)
        metrics, curve = train(model, cfg, spec["seed"], device, row["dtype"], progress, clock, task)
        if broken and metrics["status"] != "diverged":
            metrics["reason"] = "; ".join(broken + ([metrics["reason"]] if metrics["reason"] else []))
            metrics["status"] = INVALID
        row.update(metrics)
        row["peak_mem_mb"] = peak_mem_mb(device)
    except Exception as exc:  # noqa: BLE001 - a failing trial must not take the run down
        row.update({"status": "failed", "reason": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"})
        row["traceback"] = traceback.format_exc(limit=5)
    row["wall_s"] = time.perf_counter() - t_start
    if row.get("status") != "failed" and row["wall_s"] > 0:
        row["overhead_share"] = 1.0 - clock.seconds["step"] / row["wall_s"]
    return {"row": row, "curve": curve, "phases": clock.to_dict()}
