"""One training loop for every variant, and the trial function every executor calls.

A *trial* is one variant x one seed x one config on one device. :func:`run_trial` takes a
plain dict (so the same function serves in-process, process-pool and Ray execution) and
returns a dict with the trial's metrics row and its loss curve.

Training (identical for every variant): Adam(beta = (0.9, 0.98), eps = 1e-9) (Vaswani et al.
2017 §5.3) with the Noam schedule through ``LambdaLR`` (the Annotated Transformer's
``rate``: lr * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), step counted from 1);
``F.cross_entropy(..., ignore_index=pad, label_smoothing=eps)`` (note: PyTorch spreads eps over
all V classes, the Annotated ``LabelSmoothing`` over V - 2); greedy decoding for exact-match.
"""
from __future__ import annotations

import math
import os
import platform
import resource
import time
import traceback
from typing import Any, Callable

import torch
from torch.nn import functional as F

from .config import RunConfig
from .errors import DeviceError
from .model import build_model, unique_parameter_count
from .registry import Variant
from .tasks.copy import Batch, eval_set, exact_match, greedy_decode, make_batch

SOLVED = 0.99  #: exact-match threshold for "solved" (time/steps to solve)
PROBE_SEQUENCES = 200  #: held-out sequences scored at each periodic evaluation


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda when available else cpu. Raises DeviceError for unavailable cuda."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise DeviceError("--device cuda requested but CUDA is not available here (use --device cpu or auto)")
    if name not in ("cpu",) and not name.startswith("cuda"):
        raise DeviceError(f"unknown device {name!r} (use auto, cpu or cuda)")
    return torch.device(name)


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


@torch.no_grad()
def evaluate(model, data: Batch, cfg: RunConfig, device, dtype: str, chunk: int = 500) -> dict[str, float]:
    """Held-out metrics on ``data``: unsmoothed cross-entropy (nats/token), token accuracy
    (teacher forcing) and exact-match accuracy of greedy decoding (fraction of sequences)."""
    was_training = model.training
    model.eval()
    pad = cfg.model.pad
    tot_loss = tot_tok = tot_correct = tot_exact = 0.0
    n = data.src.size(0)
    for i in range(0, n, chunk):
        b = Batch(data.src[i:i + chunk], data.tgt[i:i + chunk], data.tgt_y[i:i + chunk]).to(device)
        with _autocast(device, dtype):
            logits = model(b.src, b.tgt)
            pred = greedy_decode(model, b.src, b.tgt_y.size(1))
        keep = b.tgt_y != pad
        ntok = int(keep.sum())
        tot_loss += float(loss_fn(logits, b.tgt_y, pad, 0.0)) * ntok
        tot_tok += ntok
        tot_correct += float(((logits.argmax(-1) == b.tgt_y) & keep).sum())
        tot_exact += float(exact_match(pred, b.tgt_y, pad).sum())
    model.train(was_training)
    return {"heldout_ce": tot_loss / tot_tok, "heldout_token_acc": tot_correct / tot_tok,
            "exact_match": tot_exact / n}


def peak_mem_mb(device: torch.device) -> float:
    """CUDA: ``torch.cuda.max_memory_allocated``; CPU: the process's peak RSS (ru_maxrss), MiB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def train(model, cfg: RunConfig, seed: int, device: torch.device, dtype: str = "fp32",
          progress: Callable[[int, float], None] | None = None) -> tuple[dict[str, Any], list[dict]]:
    """Train ``model`` on the copy task; returns (metrics, curve).

    The curve holds one ``{"step", "split": "train", "loss"}`` row per step and one
    ``{"step", "split": "heldout", "loss", "exact_match", "wall_s"}`` row per evaluation.
    Stops early with status ``diverged`` when the loss or the gradient norm is not finite.
    """
    tc, mc = cfg.train, cfg.model
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    probe = eval_set(tc.task, PROBE_SEQUENCES, tc.seq_len, mc.vocab, tc.eval_seed + 1)
    opt = torch.optim.Adam(model.parameters(), lr=tc.lr, betas=(0.9, 0.98), eps=1e-9, foreach=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, noam_lambda(mc.d_model, tc.warmup, tc.schedule))
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
        batch = make_batch(tc.task, tc.batch, tc.seq_len, mc.vocab, gen).to(device)
        with _autocast(device, dtype):
            logits = model(batch.src, batch.tgt)
        loss = loss_fn(logits, batch.tgt_y, mc.pad, tc.label_smoothing)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip if tc.grad_clip > 0 else math.inf)
        loss_v, gnorm_v = float(loss.detach()), float(gnorm)
        if not (math.isfinite(loss_v) and math.isfinite(gnorm_v)):
            status = "diverged"
            reason = f"non-finite {'loss' if not math.isfinite(loss_v) else 'gradient norm'} at step {step}"
            curve.append({"step": step, "split": "train", "loss": loss_v})
            break
        opt.step()
        sched.step()
        tokens += batch.ntokens
        curve.append({"step": step, "split": "train", "loss": loss_v})
        if step <= 10:
            first_losses.append(loss_v)
        if progress:
            progress(step, loss_v)
        if tc.eval_every and step % tc.eval_every == 0 and step < tc.steps:
            train_s += time.perf_counter() - t0
            m = evaluate(model, probe, cfg, device, dtype)
            curve.append({"step": step, "split": "heldout", "loss": m["heldout_ce"],
                          "exact_match": m["exact_match"], "wall_s": train_s})
            t0 = time.perf_counter()
            if solved_step is None and m["exact_match"] >= SOLVED:
                solved_step, solved_s = step, train_s
                if tc.stop_at_solved:
                    break
    train_s += time.perf_counter() - t0
    final = evaluate(model, eval_set(tc.task, tc.eval_sequences, tc.seq_len, mc.vocab, tc.eval_seed),
                     cfg, device, dtype)
    if status == "ok" and not all(math.isfinite(v) for v in final.values()):
        status, reason = "diverged", "non-finite held-out metrics"
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
        "status": status,
        "reason": reason,
    }
    return metrics, curve


def environment(device: torch.device | str = "cpu") -> dict[str, Any]:
    """Versions, threads and flags that can move results (Bouthillier et al. 2021)."""
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
        "threads": torch.get_num_threads(),
        "device": str(device),
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32 if torch.cuda.is_available() else None,
        "deterministic": torch.are_deterministic_algorithms_enabled(),
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


_REGISTRIES: dict[str, Any] = {}


def _registry(plugins: dict | None):
    import json

    from .plugins import PluginSpec
    from .registry import Registry

    key = json.dumps(plugins or {}, sort_keys=True)
    if key not in _REGISTRIES:
        _REGISTRIES[key] = Registry.from_plugins(PluginSpec.from_dict(plugins))
    return _REGISTRIES[key]


def run_trial(spec: dict[str, Any], progress: Callable[[int, float], None] | None = None) -> dict[str, Any]:
    """Run one trial from a plain dict; never raises for a failing trial.

    Args:
        spec: ``{"variant": str, "slots": {slot: component}, "config": RunConfig.to_dict(),
            "seed": int, "device": "cpu"|"cuda"|"auto", "dtype": "fp32"|"bf16",
            "plugins": PluginSpec.to_dict(), "threads": int | None}``.
        progress: optional ``progress(step, loss)`` callback.

    Returns:
        ``{"row": {...metrics...}, "curve": [...]}``; a trial that raises gets status
        ``failed`` and the exception as its reason (an out-of-memory error included).
    """
    t_start = time.perf_counter()
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    cfg = RunConfig.from_dict(spec["config"])
    slots = dict(spec.get("slots") or {})
    row: dict[str, Any] = {"variant": spec["variant"], **{f"slot_{k}": v for k, v in sorted(slots.items())},
                           "seed": spec["seed"], "device": "", "dtype": spec.get("dtype", "fp32")}
    curve: list[dict] = []
    try:
        device = resolve_device(spec.get("device", "auto"))
        row["device"] = device.type
        torch.use_deterministic_algorithms(True, warn_only=True)
        registry = _registry(spec.get("plugins"))
        variant = Variant(spec["variant"], slots)
        row.update({f"slot_{k}": v for k, v in variant.resolved().items()})
        model = build_model(registry, variant, cfg.model, seed=spec["seed"]).to(device)
        row["params"] = unique_parameter_count(model)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        metrics, curve = train(model, cfg, spec["seed"], device, row["dtype"], progress)
        row.update(metrics)
        row["peak_mem_mb"] = peak_mem_mb(device)
    except Exception as exc:  # noqa: BLE001 - a failing trial must not take the run down
        row.update({"status": "failed", "reason": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"})
        row["traceback"] = traceback.format_exc(limit=5)
    row["wall_s"] = time.perf_counter() - t_start
    return {"row": row, "curve": curve}
