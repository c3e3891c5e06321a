"""Speed benchmark: every selected variant side by side with a ``torch.nn.Transformer`` reference.

``python -m harness bench`` trains each *contender* (a variant, or :data:`REFERENCE`, PyTorch's
``nn.Transformer`` wrapped by :class:`TorchTransformer` with the same sizes) for a few steps of
the copy task with the loop's own step (:func:`harness.train.train_step`: same batch, loss,
Adam, schedule, autocast and process settings as a trial) and reports per contender and dtype:

* step time: median, quartiles and minimum over the timed steps after warm-up, and the median
  forward (loss included), backward and optimizer phases (ms);
* training tokens/s: label tokens per step / median step time (what ``run`` calls tokens/s);
* the ratio of that to the reference's tokens/s in float32 measured in the same run;
* parameters, FLOPs per step and achieved FLOP/s. FLOPs are counted by
  ``torch.utils.flop_counter.FlopCounterMode`` over one forward + backward (matmuls and
  attention; elementwise work, the optimizer and dropout are not counted);
* MFU: achieved FLOP/s / this machine's matmul throughput in the contender's dtype, measured
  by the same command as the median over rounds of one (n x n) @ (n x n) matmul
  (n = 2048 on CPU, 8192 on CUDA), timed in every round between the contenders;
* peak memory of a *fresh process* that builds the contender and trains it for a few steps
  (:func:`measure_peak_memory`): peak resident set size (CPU, Linux ``VmHWM``; interpreter and torch
  included) and, on CUDA, ``torch.cuda.max_memory_allocated``. One process holds every
  contender during timing, so in-process peaks would not belong to one contender.

Noise: contenders are interleaved, one step each per round with the order rotated every round,
so slow phases of a shared machine hit all of them alike; every figure is a median. On CUDA
every phase boundary is synchronised before the clock is read.

Sources: the reference follows the ``nn.Transformer`` docs (batch_first, bool masks with
True = blocked); FLOP counting per ``torch.utils.flop_counter``; MFU after Chowdhery et al.
2022 (PaLM, appendix B), with a measured rather than a datasheet peak.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch import nn

from ..config import ModelConfig, RunConfig
from ..errors import HarnessError
from ..checks.contract_base import sinusoidal_pe
from ..env import environment, peak_mem_mb, reset_peak_mem, trial_settings
from ..model import build_model, unique_parameter_count
from ..registry import Registry, Variant
from ..runmeta import RunMeta
from ..tasks.base import Batch
from ..recipe import make_optimizer
from ..train import train_step
from ..trial import registry_for
from .flops import DTYPES, count_flops, forget_operands, matmul_seconds, sync

#: Name of the ``torch.nn.Transformer`` reference contender.
REFERENCE = "nn.Transformer"
#: Steps a peak-memory measurement trains (the first Adam step allocates the optimizer state).
MEMORY_STEPS = 3
#: Side of the square matmul that measures the machine's matmul throughput.
PEAK_N = {"cpu": 2048, "cuda": 8192}
#: Targets of issue 6, checked in the summary: slowest / fastest variant vs the fp32 reference
#: (fp32 runs), fastest bf16 variant vs the fp32 reference, and the largest peak RSS against
#: the Annotated Transformer's own code measured on the 2-core development machine (~900 MiB).
TARGETS = {"fp32_slowest": 0.9, "fp32_fastest": 1.0, "bf16_fastest": 2.0, "peak_rss_mb": 900.0}


#: ``torch.compile`` backend of ``bench --compile``'s contenders (TorchInductor: fuses the casts,
#: LayerNorms and elementwise kernels that bound the bf16 step on a GPU, results/reference/gpu-h200-run4).
COMPILE_BACKEND = "inductor"
#: ``torch.compile`` modes ``bench --compile`` takes (PyTorch docs, ``torch.compile``): ``default``;
#: ``reduce-overhead`` (the compiled forward and backward replayed as CUDA graphs); ``max-autotune``
#: (also times Triton and cuBLAS candidates for every matmul and keeps the fastest, with CUDA graphs) and
#: ``max-autotune-no-cudagraphs``. Under the trials' deterministic mode Inductor times no candidates
#: (``torch._inductor.config.deterministic``: it takes a fixed choice), so the autotuning modes only
#: differ from ``default`` with ``bench --nondeterministic``.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
#: Modes whose compiled graphs run as CUDA graphs: each step first calls
#: ``torch.compiler.cudagraph_mark_step_begin()`` (a new iteration: the last one's outputs may be overwritten).
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")


def begin_step(compile_mode: str | None) -> None:
    """Before each training step of a model compiled in ``compile_mode``: a new iteration for the
    :data:`CUDAGRAPH_MODES` (their last outputs may be overwritten); nothing otherwise."""
    if compile_mode in CUDAGRAPH_MODES:
        torch.compiler.cudagraph_mark_step_begin()


def compiled_name(variant: str, mode: str) -> str:
    """The contender name of ``variant`` compiled in ``mode``: ``"<variant> compiled"`` for ``default``,
    ``"<variant> compiled <mode>"`` otherwise."""
    return f"{variant} compiled" if mode == "default" else f"{variant} compiled {mode}"


def compile_model(model: nn.Module | Callable, mode: str) -> nn.Module | Callable:
    """``torch.compile(model)`` with :data:`COMPILE_BACKEND` in ``mode`` (one of :data:`COMPILE_MODES`);
    ``model`` may also be a function (a trial group's step: :mod:`harness.perf.seeds`).

    Raises:
        BenchError: an unknown mode.
    """
    if mode not in COMPILE_MODES:
        raise BenchError(f"unknown compile mode {mode!r} (use {', '.join(COMPILE_MODES)})")
    return torch.compile(model, backend=COMPILE_BACKEND, **({} if mode == "default" else {"mode": mode}))


class BenchError(HarnessError):
    """Bad bench options (steps, dtypes, compile modes) or a peak-memory measurement that failed."""


class TorchTransformer(nn.Module):
    """``torch.nn.Transformer`` with the harness's embeddings and generator around it.

    Same sizes as the harness's ``baseline`` (post-norm, separate source/target embeddings
    scaled by sqrt(d_model) plus the sinusoidal PE with dropout, generator ``Linear(D, V)``).
    Masks: ``src_key_padding_mask`` / ``memory_key_padding_mask`` (S pads) and
    ``tgt_key_padding_mask`` (T pads) plus a causal ``tgt_mask``, all bool with True =
    blocked (the ``nn.MultiheadAttention`` convention). Departure from ``baseline``:
    ``nn.Transformer`` always ends the encoder and the decoder with a LayerNorm (2 x 2D
    more parameters).

    Shape:
        forward(src (B, S), tgt (B, T)) -> logits (B, T, V).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        v, d = cfg.vocab, cfg.d_model
        self.src_lut = nn.Embedding(v, d)
        self.tgt_lut = nn.Embedding(v, d)
        pe = sinusoidal_pe(cfg.max_len, d).float()  # (max_len, D) the §3.5 table, rounded to float32
        self.register_buffer("pe", pe, persistent=False)
        self.dropout = nn.Dropout(cfg.dropout)
        self.transformer = nn.Transformer(d_model=d, nhead=cfg.h, num_encoder_layers=cfg.N,
                                          num_decoder_layers=cfg.N, dim_feedforward=cfg.d_ff,
                                          dropout=cfg.dropout, batch_first=True)
        self.generator = nn.Linear(d, v)

    def embed(self, lut: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
        """ids (B, L) -> dropout(lut(ids) * sqrt(D) + PE[:L]) (B, L, D)."""
        return self.dropout(lut(ids) * math.sqrt(self.cfg.d_model) + self.pe[: ids.size(1)])

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        t = tgt.size(1)
        causal = torch.ones(t, t, dtype=torch.bool, device=tgt.device).triu(1)  # (T, T) True = blocked
        src_pad, tgt_pad = src == self.cfg.pad, tgt == self.cfg.pad  # (B, S), (B, T)
        out = self.transformer(self.embed(self.src_lut, src), self.embed(self.tgt_lut, tgt), tgt_mask=causal,
                               src_key_padding_mask=src_pad, tgt_key_padding_mask=tgt_pad,
                               memory_key_padding_mask=src_pad, tgt_is_causal=True)  # (B, T, D)
        return self.generator(out)


def build_contender(name: str, slots: dict | None, cfg: ModelConfig, registry: Registry | None,
                    seed: int = 0) -> nn.Module:
    """The model of one contender: :data:`REFERENCE` or a variant (``slots`` as in a spec).

    Raises:
        UnknownNameError: a slot's component is not registered.
    """
    if name == REFERENCE:
        torch.manual_seed(seed)
        return TorchTransformer(cfg.validate())
    return build_model(registry, Variant(name, dict(slots or {})), cfg, seed=seed)


@dataclass
class Contender:
    """One model under test with its optimizer; ``times[dtype]`` holds per-step phase times (s)."""

    name: str
    kind: str  # "reference", "variant" or "compiled"
    slots: dict
    model: nn.Module
    opt: Any
    sched: Any
    params: int
    compile_mode: str | None = None  # a COMPILE_MODES entry for kind "compiled"
    times: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    flops: dict[str, int] = field(default_factory=dict)
    memory: dict[str, dict[str, float]] = field(default_factory=dict)


def timed_step(c: Contender, batch: Batch, cfg: RunConfig, device: torch.device, dtype: str) -> dict[str, float]:
    """One training step of ``c`` with its phases timed (seconds); frees the gradients afterwards."""
    marks: list[float] = []

    def clock(_phase: str) -> None:
        sync(device)
        marks.append(time.perf_counter())

    c.model.train()
    begin_step(c.compile_mode)
    sync(device)
    t0 = time.perf_counter()
    train_step(c.model, batch, c.opt, c.sched, cfg, device, dtype, clock=clock)
    c.opt.zero_grad(set_to_none=True)  # untimed: one process holds every contender
    return {"forward": marks[0] - t0, "backward": marks[1] - marks[0], "optimizer": marks[2] - marks[1],
            "step": marks[2] - t0}


def measure_peak_memory(name: str, slots: dict | None, cfg: RunConfig, device: str, dtype: str, plugins: dict | None,
                 steps: int = MEMORY_STEPS, timeout_s: float = 900) -> dict[str, float]:
    """Peak memory of one contender trained for ``steps`` steps in a fresh Python process.

    Returns:
        ``{"peak_rss_mb", "base_rss_mb"}`` (peak resident set size of the whole process and
        its resident size before the model was built, MiB) plus ``"peak_cuda_mb"``
        (``torch.cuda.max_memory_allocated``) on CUDA.

    Raises:
        BenchError: the measuring process failed (its last stderr line is in the message).
    """
    payload = json.dumps({"name": name, "slots": slots, "config": cfg.to_dict(), "device": device, "dtype": dtype,
                          "plugins": plugins, "steps": steps, "threads": torch.get_num_threads()})
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)}
    proc = subprocess.run([sys.executable, "-m", "harness.perf.bench"], input=payload, capture_output=True, text=True,
                          env=env, timeout=timeout_s)
    if proc.returncode != 0 or not proc.stdout.strip():
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise BenchError(f"peak-memory measurement for {name} ({dtype}) failed: {last}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _memory_main(payload: str) -> None:
    """Body of the peak-memory process (``python -m harness.perf.bench``, the spec as JSON on stdin)."""
    spec = json.loads(payload)
    torch.set_num_threads(int(spec["threads"]))
    trial_settings()
    cfg = RunConfig.from_dict(spec["config"])
    device = torch.device(spec["device"])
    task = registry_for(spec.get("plugins")).task(cfg.train.task).for_config(cfg)
    registry = None
    if spec["name"] != REFERENCE:
        registry = registry_for(spec.get("plugins"))
    reset_peak_mem(device)
    base = peak_mem_mb(torch.device("cpu"))
    model = build_contender(spec["name"], spec["slots"], cfg.model, registry).to(device)
    opt, sched = make_optimizer(model, cfg)
    gen = torch.Generator().manual_seed(0)
    tc = cfg.train
    for _ in range(int(spec["steps"])):
        batch = task.make_batch(tc.batch, tc.seq_len, cfg.model.vocab, gen).to(device)
        train_step(model, batch, opt, sched, cfg, device, spec["dtype"])
    sync(device)
    out = {"peak_rss_mb": peak_mem_mb(torch.device("cpu")), "base_rss_mb": base}
    if device.type == "cuda":
        out["peak_cuda_mb"] = peak_mem_mb(device)
    print(json.dumps(out))


def build_contenders(variants: list[Variant], cfg: RunConfig, device: torch.device, registry: Registry,
                     compile: Sequence[str] = ()) -> dict[str, Contender]:
    """The contenders by name, in table order: :data:`REFERENCE`, each variant, then each variant in each
    ``compile`` mode (:func:`compiled_name`, :func:`compile_model`); each with its optimizer and schedule."""
    names = [(REFERENCE, "reference", REFERENCE, {}, None)]  # (contender, kind, model's name, slots, mode)
    names += [(v.name, "variant", v.name, dict(v.slots), None) for v in variants]
    names += [(compiled_name(v.name, m), "compiled", v.name, dict(v.slots), m) for v in variants for m in compile]
    contenders: dict[str, Contender] = {}
    for name, kind, base, slots, mode in names:
        model = build_contender(base, slots, cfg.model, registry).to(device)
        opt, sched = make_optimizer(model, cfg)
        model = compile_model(model, mode) if mode else model
        contenders[name] = Contender(name, kind, slots, model, opt, sched, unique_parameter_count(model),
                                     compile_mode=mode)
    return contenders


def run_bench(variants: list[Variant], cfg: RunConfig, device: torch.device, dtypes: list[str], steps: int,
              warmup: int, registry: Registry, plugins: dict | None = None, memory: bool = True,
              log: Callable[[str], None] | None = None, compile: Sequence[str] = (),
              deterministic: bool = True) -> tuple[list[dict], dict[str, Any]]:
    """Benchmark ``variants`` and the reference (see the module docstring).

    Args:
        dtypes: ``["fp32"]``, ``["bf16"]`` or both; the reference always runs in fp32 too
            (the yardstick of every ratio).
        steps: timed rounds (>= 1); warmup: untimed rounds first (>= 0).
        memory: run the fresh-process peak-memory measurements.
        compile: :data:`COMPILE_MODES` to also run each variant in through ``torch.compile``
            (:func:`compile_model`): per mode a contender :func:`compiled_name` of kind ``compiled`` with
            the same initial weights (no peak-memory measurement).
        deterministic: False: the steps run without deterministic algorithms, torch's and Inductor's
            (``bench --nondeterministic``); this process keeps them off afterwards.

    Returns:
        ``(rows, info)``: one row per contender x dtype (see :func:`bench_rows`), and
        ``{"peak_gflop_per_s": {dtype: value}, "tokens_per_step": int, "bench_s": float}``.

    Raises:
        BenchError: ``steps`` < 1, ``warmup`` < 0, unknown dtype, or a peak-memory measurement failed.
    """
    if steps < 1 or warmup < 0:
        raise BenchError(f"--steps must be >= 1 and --warmup-steps >= 0, got {steps} and {warmup}")
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        raise BenchError(f"unknown dtype {bad[0]!r} (use fp32, bf16 or both)")
    say = log or (lambda _line: None)
    t_start = time.perf_counter()
    trial_settings()
    if not deterministic:
        torch.use_deterministic_algorithms(False)  # Inductor's deterministic mode goes with it
    tc, mc = cfg.train, cfg.model
    contenders = build_contenders(variants, cfg, device, registry, compile)
    runs = [(name, d) for name in contenders for d in dtypes]
    if "fp32" not in dtypes:
        runs.insert(0, (REFERENCE, "fp32"))
    task = registry.task(tc.task).for_config(cfg)
    gen = torch.Generator().manual_seed(0)
    batch = task.make_batch(tc.batch, tc.seq_len, mc.vocab, gen).to(device)
    tokens = batch.ntokens
    for name, dtype in runs:
        model = contenders[name].model
        contenders[name].flops[dtype] = count_flops(getattr(model, "_orig_mod", model), batch, cfg, device, dtype)
    if memory:
        for name, dtype in runs:
            c = contenders[name]
            if c.kind == "compiled":
                continue
            say(f"peak memory: {name} {dtype}")
            c.memory[dtype] = measure_peak_memory(name, c.slots, cfg, device.type, dtype, plugins)
    n = PEAK_N.get(device.type, 2048)
    peaks = _timed_rounds(contenders, runs, lambda: task.make_batch(tc.batch, tc.seq_len, mc.vocab, gen).to(device),
                          cfg, device, n, warmup, steps, say)
    rows = bench_rows(contenders, runs, tokens, peaks)
    return rows, {"peak_gflop_per_s": peaks, "peak_n": n, "tokens_per_step": tokens,
                  "bench_s": time.perf_counter() - t_start}


def _timed_rounds(contenders: dict[str, Contender], runs: list[tuple[str, str]], next_batch: Callable[[], Batch],
                  cfg: RunConfig, device: torch.device, n: int, warmup: int, steps: int,
                  say: Callable[[str], None]) -> dict[str, float]:
    """``warmup`` + ``steps`` interleaved rounds: one timed step of every (contender, dtype) in
    ``runs`` on a fresh batch, order rotated each round, then one (n x n) matmul per dtype.
    Fills ``contenders[name].times`` (timed rounds only); returns the machine's matmul
    throughput per dtype (GFLOP/s, median over the timed rounds)."""
    peak_dtypes = sorted({d for _, d in runs})
    peak_times: dict[str, list[float]] = {d: [] for d in peak_dtypes}
    for d in peak_dtypes:  # warm-up the matmul
        matmul_seconds(d, device, n)
    rounds = warmup + steps
    for r in range(rounds):
        batch = next_batch()
        order = runs[r % len(runs):] + runs[:r % len(runs)]
        t_round = time.perf_counter()
        for name, dtype in order:
            t = timed_step(contenders[name], batch, cfg, device, dtype)
            if r >= warmup:
                contenders[name].times.setdefault(dtype, []).append(t)
        for d in peak_dtypes:
            s = matmul_seconds(d, device, n)
            if r >= warmup:
                peak_times[d].append(s)
        say(f"round {r + 1}/{rounds}{' (warm-up)' if r < warmup else ''}: {time.perf_counter() - t_round:.1f} s")
    forget_operands()
    return {d: 2 * n ** 3 / statistics.median(ts) / 1e9 for d, ts in peak_times.items()}


def bench_rows(contenders: dict[str, Contender], runs: list[tuple[str, str]], tokens: int,
               peaks: dict[str, float]) -> list[dict]:
    """One row per (contender, dtype): times in ms, rates per second, ratios to the reference."""
    rows = []
    for name, dtype in runs:
        c = contenders[name]
        ts = c.times.get(dtype, [])
        step = [t["step"] for t in ts]
        med = statistics.median(step)
        q = statistics.quantiles(step, n=4, method="inclusive") if len(step) > 1 else [med, med, med]
        flops = c.flops.get(dtype, 0)
        achieved = flops / med / 1e9
        row = {"contender": name, "kind": c.kind, "compile_mode": c.compile_mode or "", "dtype": dtype,
               "params": c.params,
               "gflop_per_step": flops / 1e9, "tokens_per_step": tokens, "steps_timed": len(step),
               "step_ms_median": med * 1e3, "step_ms_p25": q[0] * 1e3, "step_ms_p75": q[2] * 1e3,
               "step_ms_min": min(step) * 1e3,
               **{f"{p}_ms": statistics.median(t[p] for t in ts) * 1e3 for p in ("forward", "backward", "optimizer")},
               "tokens_per_s": tokens / med, "achieved_gflop_per_s": achieved,
               "peak_gflop_per_s": peaks[dtype], "mfu": achieved / peaks[dtype]}
        mem = c.memory.get(dtype, {})
        row["peak_rss_mb"] = mem.get("peak_rss_mb", float("nan"))
        row["model_rss_mb"] = mem.get("peak_rss_mb", float("nan")) - mem.get("base_rss_mb", float("nan"))
        if "peak_cuda_mb" in mem:
            row["peak_cuda_mb"] = mem["peak_cuda_mb"]
        row.update({f"slot_{k}": v for k, v in sorted(c.slots.items())})
        rows.append(row)
    ref = {r["dtype"]: r["tokens_per_s"] for r in rows if r["contender"] == REFERENCE}
    for r in rows:
        r["vs_reference_fp32"] = r["tokens_per_s"] / ref["fp32"]
        r["vs_reference_same_dtype"] = r["tokens_per_s"] / ref[r["dtype"]] if r["dtype"] in ref else float("nan")
    return rows


def summary_lines(rows: list[dict]) -> list[str]:
    """Plain-language checks against :data:`TARGETS` (ratios within this run)."""
    out = []
    ref = {r["dtype"]: r for r in rows if r["contender"] == REFERENCE}
    for dtype in ("fp32", "bf16"):
        vs = [r for r in rows if r["kind"] == "variant" and r["dtype"] == dtype]
        if not vs:
            continue
        slow = min(vs, key=lambda r: r["vs_reference_fp32"])
        fast = max(vs, key=lambda r: r["vs_reference_fp32"])
        if dtype == "fp32":
            out.append(_check(f"fp32: slowest variant {slow['contender']} at {slow['vs_reference_fp32']:.2f}x "
                              f"{REFERENCE}'s tokens/s", slow["vs_reference_fp32"], TARGETS["fp32_slowest"]))
            out.append(_check(f"fp32: fastest variant {fast['contender']} at {fast['vs_reference_fp32']:.2f}x",
                              fast["vs_reference_fp32"], TARGETS["fp32_fastest"]))
        else:
            out.append(_check(f"bf16: fastest variant {fast['contender']} at {fast['vs_reference_fp32']:.2f}x "
                              f"{REFERENCE}'s fp32 tokens/s (slowest {slow['contender']} "
                              f"{slow['vs_reference_fp32']:.2f}x; {REFERENCE} bf16 "
                              f"{ref['bf16']['vs_reference_fp32']:.2f}x)" if "bf16" in ref else
                              f"bf16: fastest variant {fast['contender']} at {fast['vs_reference_fp32']:.2f}x "
                              f"{REFERENCE}'s fp32 tokens/s", fast["vs_reference_fp32"], TARGETS["bf16_fastest"]))
        out.append(f"{dtype}: MFU of the variants {min(r['mfu'] for r in vs):.0%}-{max(r['mfu'] for r in vs):.0%} "
                   f"({REFERENCE}: {ref[dtype]['mfu']:.0%})" if dtype in ref else
                   f"{dtype}: MFU of the variants {min(r['mfu'] for r in vs):.0%}-{max(r['mfu'] for r in vs):.0%}")
        compiled = [r for r in rows if r["kind"] == "compiled" and r["dtype"] == dtype]
        if compiled:
            out.append(f"{dtype}: MFU of the compiled contenders: " + ", ".join(f"{r['contender']} {r['mfu']:.0%}" for r in compiled))
        mem = [r["peak_rss_mb"] for r in vs if not math.isnan(r["peak_rss_mb"])]
        if mem and dtype in ref and not math.isnan(ref[dtype]["peak_rss_mb"]):
            big = max((r for r in vs if not math.isnan(r["peak_rss_mb"])), key=lambda r: r["peak_rss_mb"])
            target = TARGETS["peak_rss_mb"]
            out.append(f"{dtype}: largest peak RSS {big['contender']} {big['peak_rss_mb']:.0f} MiB "
                       f"({REFERENCE}: {ref[dtype]['peak_rss_mb']:.0f} MiB): "
                       f"{'meets' if big['peak_rss_mb'] <= target else 'misses'} the target <= {target:.0f} MiB "
                       f"(the Annotated Transformer's code)")
    return out


def _check(text: str, value: float, target: float) -> str:
    return f"{text}: {'meets' if value >= target else 'misses'} the target >= {target:.1f}x"


#: Columns of the printed / markdown table: (csv column, header, format)
TABLE = [("contender", "contender", "{}"), ("dtype", "dtype", "{}"), ("params", "params", "{:,}"),
         ("gflop_per_step", "GFLOP/step", "{:.3g}"), ("step_ms_median", "step ms", "{:.0f}"),
         ("step_iqr", "IQR ms", "{}"), ("forward_ms", "fwd ms", "{:.0f}"), ("backward_ms", "bwd ms", "{:.0f}"),
         ("optimizer_ms", "opt ms", "{:.0f}"), ("tokens_per_s", "tokens/s", "{:,.0f}"),
         ("vs_reference_fp32", f"x {REFERENCE} fp32", "{:.2f}"), ("achieved_gflop_per_s", "GFLOP/s", "{:.0f}"),
         ("mfu", "MFU", "{:.0%}"), ("peak_rss_mb", "peak RSS MiB", "{:.0f}")]


#: Columns of :data:`TABLE` the terminal leaves to bench.md, first to last, while its table is wider
#: than 120 characters (:func:`harness.report.terminal.narrowed_table`).
TERMINAL_DROPS = ("peak RSS MiB", "params", "GFLOP/step", "fwd ms", "bwd ms", "opt ms", "GFLOP/s", "IQR ms")


def table_frame(rows: list[dict]):
    """The rows as the printed table (pandas DataFrame of formatted strings)."""
    import pandas as pd

    out = []
    for r in rows:
        r = {**r, "step_iqr": f"{r['step_ms_p25']:.0f}-{r['step_ms_p75']:.0f}"}
        out.append({head: ("—" if isinstance(r.get(col), float) and math.isnan(r[col]) else fmt.format(r[col]))
                    for col, head, fmt in TABLE})
    return pd.DataFrame(out)


def bench_meta(command: str, preset: str, cfg: RunConfig, device: torch.device, dtypes: list[str], steps: int,
               warmup: int, variants: list[Variant], plugins: dict | None) -> RunMeta:
    """``config.json`` contents of a bench run."""
    return RunMeta("bench", command, preset, cfg.to_dict(), [v.name for v in variants], device.type,
                   environment(device), plugins=plugins, dtypes=dtypes, steps=steps, warmup_steps=warmup,
                   reference=REFERENCE)


if __name__ == "__main__":  # peak-memory measurement: python -m harness.perf.bench < spec.json
    _memory_main(sys.stdin.read())
