"""Where a training step's time goes, op by op: ``python -m harness bench --kernels N``.

Each selected variant (and the ``nn.Transformer`` reference, in fp32 and in every ``--dtype``)
trains ``warmup`` untimed steps, then ``steps`` steps under ``torch.profiler`` with the loop's own
step (:func:`harness.train.train_step`: autocast, float32 loss, gradient norm, Adam, schedule).
The profile's events are summed by name:

* on CUDA, the **GPU kernels** (``ProfilerActivity.CUDA`` events): their time on the device, which
  is what MFU measures against (the host's launch overhead does not appear here; ``bench`` and its
  captured arms measure that);
* on the CPU, every op's **self** CPU time (time inside the op minus its children: no op is
  counted twice).

Each name is put in a coarse category by substrings of its lower-cased name (:data:`CATEGORIES`,
first match wins; ``other`` otherwise), so a table can say "matmuls take X % of the step" without
naming every vendor kernel. The categories are a reading aid, not a measurement: a fused kernel
counts where its name puts it.

Source: ``torch.profiler`` (PyTorch docs, "PyTorch Profiler"); MFU and why the non-matmul share
matters: Chowdhery et al. 2022 (PaLM), appendix B.
"""
from __future__ import annotations

import os
import time
from collections import defaultdict
from typing import Callable, Sequence

import torch

from ..config import RunConfig
from ..registry import Registry, Variant
from ..tasks.base import Batch
from ..recipe import make_optimizer
from ..train import train_step

#: (category, substrings of a lower-cased op or kernel name); the first category with a match wins.
#: Fused attention kernels (cuDNN's ``..._sdpa_..._wgmma_...``, xformers' ``fmha_cutlass...``) come
#: before matmul, whose GEMM names they contain; ``nvjet_...`` are cuBLAS's Hopper GEMMs;
#: ``GammaBetaBackward`` is LayerNorm's weight gradient (names seen on an H200:
#: results/reference/gpu-h200-run4/bench-kernels-gpu).
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("optimizer", ("adam", "multi_tensor", "foreach", "clip_grad")),
    ("attention", ("sdpa", "flash", "fmha", "attention", "softmax")),
    ("matmul", ("gemm", "matmul", "aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::linear",
                "cutlass", "xmma", "cublas", "wgmma", "nvjet", "mkldnn_matmul", "onednn")),
    ("normalisation", ("layer_norm", "layernorm", "rms_norm", "batch_norm", "gammabeta")),
    ("embedding and loss", ("embedding", "nll_loss", "cross_entropy", "log_softmax", "gather", "scatter",
                            "index")),
    ("views and allocation", ("aten::view", "transpose", "aten::empty", "as_strided", "reshape", "permute",
                              "expand", "unsqueeze", "squeeze", "aten::slice", "aten::select", "detach", "alias",
                              "aten::t")),
    ("copy and cast", ("copy", "cast", "convert", "to_copy", "memcpy", "memset", "fill", "cat", "contiguous")),
    ("reduction", ("reduce", "sum", "mean", "amax", "norm")),
    ("dropout", ("bernoulli", "dropout", "philox")),
    ("elementwise", ("elementwise", "vectorized", "add", "mul", "div", "sub", "where", "masked",
                     "aten::relu", "aten::gelu", "aten::silu", "threshold", "clamp", "exp", "sqrt", "pow", "tanh")),
)
#: Template words of CUDA kernel names that say nothing about the op (``gpu_kernel_impl_nocast``,
#: ``LoadWithCast``): removed before matching, so an add kernel is not read as a cast.
_NOISE = ("nocast", "withcast")


def category(name: str) -> str:
    """The :data:`CATEGORIES` entry of an op or kernel ``name`` (``other`` when none matches)."""
    low = name.lower()
    for word in _NOISE:
        low = low.replace(word, "")
    for cat, keys in CATEGORIES:
        if any(k in low and (k != "aten::t" or low == k) for k in keys):  # aten::t alone, not aten::tanh
            return cat
    return "other"


def _event_us(event, on_device: bool) -> float:
    """Microseconds of one profiler event: a kernel's device time, or an op's self CPU time."""
    if on_device:
        for attr in ("device_time_total", "cuda_time_total", "device_time", "cuda_time"):
            value = getattr(event, attr, None)
            if value is not None:
                return float(value)
        return 0.0
    return float(getattr(event, "self_cpu_time_total", 0.0))


def op_rows(events, on_device: bool, steps: int) -> list[dict]:
    """The profile's ``events`` summed by name, per step, largest first.

    Args:
        events: ``torch.profiler.profile(...).events()``.
        on_device: True: GPU kernels only (``DeviceType.CUDA``); False: CPU ops by self time.
        steps: the profiled steps (the totals are divided by it).

    Returns:
        ``[{"op", "category", "calls_per_step", "ms_per_step", "share"}, ...]``; ``share`` is of the
        summed time of every row (0..1).
    """
    want = torch.autograd.DeviceType.CUDA if on_device else torch.autograd.DeviceType.CPU
    total: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for e in events:
        if getattr(e, "device_type", None) != want:
            continue
        total[e.name] += _event_us(e, on_device)
        calls[e.name] += 1
    grand = sum(total.values()) or 1.0
    rows = [{"op": name, "category": category(name), "calls_per_step": calls[name] / steps,
             "ms_per_step": us / 1000.0 / steps, "share": us / grand} for name, us in total.items()]
    return sorted(rows, key=lambda r: -r["ms_per_step"])


def category_rows(rows: list[dict]) -> list[dict]:
    """``rows`` (of :func:`op_rows`) summed by category, largest first."""
    by: dict[str, dict] = {}
    for r in rows:
        c = by.setdefault(r["category"], {"category": r["category"], "ops": 0, "ms_per_step": 0.0, "share": 0.0})
        c["ops"] += 1
        c["ms_per_step"] += r["ms_per_step"]
        c["share"] += r["share"]
    return sorted(by.values(), key=lambda r: -r["ms_per_step"])


#: Kineto's log threshold set for the profiled steps unless the user set one: torch 2.13's profiler prints
#: a ``USDT: ... profiler_start`` / ``profiler_stop`` line to stderr at every start and stop (its level 5),
#: so a threshold of 6 hides those; ``KINETO_LOG_LEVEL=0`` brings every Kineto message back.
KINETO_QUIET = "6"


def quiet_profiler() -> None:
    """Keep torch.profiler's start/stop lines off the terminal (:data:`KINETO_QUIET`); read by Kineto
    when a profile starts, so call it before."""
    os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_QUIET)


def profile_steps(model: torch.nn.Module, batch: Batch, cfg: RunConfig, device: torch.device, dtype: str,
                  steps: int, warmup: int, compile_mode: str | None = None) -> list[dict]:
    """``warmup`` untimed training steps of ``model`` on ``batch``, then ``steps`` under
    ``torch.profiler``; returns :func:`op_rows` (GPU kernels on CUDA, CPU ops by self time otherwise).
    ``compile_mode``: the model goes through :func:`harness.perf.bench.compile_model` in that mode first
    (it compiles in the warm-up steps)."""
    from torch.profiler import ProfilerActivity, profile

    from .bench import begin_step, compile_model

    quiet_profiler()
    opt, sched = make_optimizer(model, cfg)
    model = compile_model(model, compile_mode) if compile_mode else model
    model.train()

    def step() -> None:
        begin_step(compile_mode)
        train_step(model, batch, opt, sched, cfg, device, dtype)

    for _ in range(warmup):
        step()
    on_device = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_device else [])
    if on_device:
        torch.cuda.synchronize(device)
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        if on_device:
            torch.cuda.synchronize(device)
    return op_rows(prof.events(), on_device, steps)


def run_kernel_bench(variants: list[Variant], cfg: RunConfig, device: torch.device, dtypes: list[str], steps: int,
                     warmup: int, registry: Registry, top: int, log: Callable[[str], None] | None = None,
                     compile: Sequence[str] = ()) -> tuple[list[dict], dict]:
    """``bench --kernels N``: :func:`profile_steps` for the reference and each variant in each dtype, then
    each variant compiled in each ``compile`` mode (``bench --kernels N --compile MODE,...``).

    Returns:
        ``(rows, info)``: the ``top`` largest ops of every arm (each row with ``arm`` and ``rank``),
        and ``{"categories": {arm: category_rows}, "ms_profiled": {arm: summed ms per step},
        "bench_s": float, "unit": "GPU kernels" | "CPU ops (self time)"}``.

    Raises:
        UnknownNameError: a variant's component is not registered.
    """
    from .bench import REFERENCE, build_contender, compiled_name

    t0 = time.perf_counter()
    tc, mc = cfg.train, cfg.model
    batch = registry.task(tc.task).for_config(cfg).make_batch(tc.batch, tc.seq_len, mc.vocab, torch.Generator().manual_seed(0))
    batch = batch.to(device)
    arms = [(REFERENCE, REFERENCE, {}, d, None) for d in dict.fromkeys(["fp32", *dtypes])]
    arms += [(v.name, v.name, dict(v.slots), d, None) for v in variants for d in dtypes]
    arms += [(compiled_name(v.name, m), v.name, dict(v.slots), d, m) for v in variants for m in compile for d in dtypes]
    rows, cats, summed = [], {}, {}
    for name, base, slots, dtype, mode in arms:
        arm = f"{name} {dtype}"
        if log:
            log(f"profiling {arm}: {warmup} warm-up + {steps} profiled steps")
        model = build_contender(base, slots, mc, registry).to(device)
        got = profile_steps(model, batch, cfg, device, dtype, steps, warmup, compile_mode=mode)
        cats[arm] = category_rows(got)
        summed[arm] = sum(r["ms_per_step"] for r in got)
        rows += [{"arm": arm, "rank": i + 1, **r} for i, r in enumerate(got[:top])]
        del model
    unit = "GPU kernels" if device.type == "cuda" else "CPU ops (self time)"
    return rows, {"categories": cats, "ms_profiled": summed, "bench_s": time.perf_counter() - t0, "unit": unit}


def kernel_markdown(rows: list[dict], info: dict, table: Callable | None = None) -> str:
    """Per arm: its category table, then its largest ops (GitHub markdown; op names cut to 70
    characters, ms to 3 decimals, whole calls per step as integers). ``table(frame, floatfmt=".3f")``
    lays each table out instead of plain markdown (``bench`` passes
    :func:`harness.report.terminal.wrapped_table` for the terminal)."""
    import pandas as pd

    layout = table or (lambda frame, floatfmt: frame.to_markdown(index=False, tablefmt="github", floatfmt=floatfmt))
    parts = []
    for arm, cats in info["categories"].items():
        parts += [f"### {arm}: {info['ms_profiled'][arm]:.2f} ms of {info['unit']} per step", ""]
        parts += [layout(_formatted(pd.DataFrame(cats)), floatfmt=".3f"), ""]
        ops = pd.DataFrame([r for r in rows if r["arm"] == arm]).drop(columns=["arm"])
        ops["op"] = ops["op"].map(lambda s: s if len(s) <= 70 else s[:67] + "...")
        parts += [layout(_formatted(ops), floatfmt=".3f"), ""]
    return "\n".join(parts)


def _formatted(frame):
    """A category or op table for printing: ``share`` in %, ``calls_per_step`` and ``ops`` as ``%g``
    text (tabulate reads a whole count back as an integer, untouched by the table's ``.3f``; a
    fractional one, an op seen in only some profiled steps, shows 3 decimals like ``ms_per_step``)."""
    frame = frame.copy()
    frame["share"] = frame["share"].map(lambda s: f"{100 * s:.1f}%")
    for col in ("calls_per_step", "ops"):
        if col in frame:
            frame[col] = frame[col].map(lambda v: f"{v:g}")
    return frame
