"""Seeds per second: one variant's training step run sequentially, vectorised and captured, side by side.

``python -m harness bench --group-sizes 1,4,16`` times, in one process and interleaved round-robin
(one step of every arm per round, order rotated each round, a fresh batch per seed each round):

* ``sequential``: one model stepped with the loop's own step (:func:`harness.train.train_step`: the
  fused Adam, the gradient norm, the ``.item()`` syncs of a trial); a seed costs one such step;
* ``vectorised K``: K models of the variant stacked and stepped as one program
  (:class:`harness.vstep.GroupStep`, what ``run --vectorise-seeds on`` trains), one step for K seeds;
* ``captured K`` (CUDA only): the same step replayed as a CUDA graph (:class:`harness.vstep.CapturedStep`);
* with ``bench --compile MODE``: ``compiled K``, the same step (forward, backward, clipping and Adam
  on the flat buffers, one function) through ``torch.compile``, so that Inductor fuses across all of
  it, and on CUDA ``compiled captured K``, that compiled step captured as a CUDA graph (no launch gaps,
  no sync: the step ``run`` would train with if it compiled). A compiled arm compiles in its first
  round (tens of seconds on a CPU): give the warm-up rounds to it.

Each row gives the median step time, the time per seed-step (step / K), seed-steps per second, the
speed-up over ``sequential``, trials per hour at the config's ``train.steps`` (training steps only:
the evaluations and the final decoding are not in it), and MFU: K x the model FLOPs of one
forward + backward (:func:`harness.perf.flops.count_flops`) per step time, over this machine's matmul
throughput in the same dtype measured by the same command (:func:`harness.perf.flops.matmul_seconds`).
The batches are drawn and stacked before the clock starts (host-side batch drawing is not timed
in any arm). On CUDA every step is synchronised before the clock is read. ``ops / step``: the
aten ops that do work (no views, allocations or composites' own entries) in one more (untimed)
step (:func:`harness.perf.overhead.count_ops`; a captured arm's are its step's, the kernels its
graph replays): on a GPU about one kernel each, so it says what a launch-bound step costs on any
device (not counted for compiled arms: Inductor's fused kernels are not aten ops).
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch

from .bench import PEAK_N, compile_model
from .flops import count_flops, matmul_seconds, sync
from ..config import RunConfig
from ..model import build_model, unique_parameter_count
from ..registry import Registry, Variant
from ..recipe import group_step, make_optimizer
from ..schedule import lr_at
from ..train import train_step
from ..vstep import CapturedStep, stack_batches


def arms(group_sizes: list[int], device: torch.device, compile_mode: str | None = None) -> list[tuple[str, int]]:
    """``[(kind, K)]``: ``("sequential", 1)``, then ``("vectorised", K)`` per size and, on CUDA,
    ``("captured", K)`` per size; with ``compile_mode`` also ``("compiled", K)`` per size and, on CUDA,
    ``("compiled captured", K)``."""
    kinds = ["vectorised"] + (["captured"] if device.type == "cuda" else [])
    if compile_mode:
        kinds += ["compiled"] + (["compiled captured"] if device.type == "cuda" else [])
    return [("sequential", 1)] + [(kind, k) for kind in kinds for k in group_sizes]


def arm_name(kind: str, k: int) -> str:
    return kind if kind == "sequential" else f"{kind} K={k}"


class _Arm:
    """The models and step function of one arm."""

    def __init__(self, kind: str, k: int, variant: Variant, cfg: RunConfig, registry: Registry,
                 device: torch.device, dtype: str, compile_mode: str | None = None):
        self.kind, self.k, self.cfg, self.device, self.dtype = kind, k, cfg, device, dtype
        models = [build_model(registry, variant, cfg.model, seed=s).to(device) for s in range(k)]
        self.params = unique_parameter_count(models[0])
        self.lr = lr_at(cfg.train, cfg.model.d_model)
        self.times: list[float] = []
        self.steps = 0
        if kind == "sequential":
            self.model = models[0]
            self.opt, self.sched = make_optimizer(self.model, cfg)
            return
        self.group = group_step(models, cfg, device, dtype)
        fn = compile_model(self.group.step, compile_mode) if kind.startswith("compiled") else self.group.step
        self.run = CapturedStep(self.group, fn) if kind.endswith("captured") else fn

    def _prepared(self, batches: list, timed: bool = True):
        """One step of this arm on the first K of ``batches``, its inputs already on the device, as a
        call: what the arm times (a group's learning rate set, then its step, captured or not), or with
        ``timed=False`` a group's uncaptured step alone (what its graph holds: what ``ops`` counts)."""
        if self.kind == "sequential":
            batch = batches[0].to(self.device)
            return lambda: train_step(self.model, batch, self.opt, self.sched, self.cfg, self.device, self.dtype)
        stacked = [x.to(self.device) for x in stack_batches(batches[:self.k], pad=self.cfg.model.pad)]
        if not timed:
            return lambda: self.group.step(*stacked)
        lr = self.lr(max(self.steps, 1))
        return lambda: (self.group.set_lr(lr), self.run(*stacked))

    def ops(self, batches: list) -> int | None:
        """The ops that do work in one untimed step on the first K of ``batches`` (a captured arm: its
        uncaptured step, what its graph holds); None for a compiled arm (Inductor's kernels are not aten ops)."""
        from .overhead import count_ops

        return None if self.kind.startswith("compiled") else count_ops(self._prepared(batches, timed=False))

    def step(self, batches: list) -> float:
        """One timed step on the first K of ``batches``; seconds."""
        self.steps += 1
        run = self._prepared(batches)
        sync(self.device)
        t0 = time.perf_counter()
        run()
        sync(self.device)
        return time.perf_counter() - t0


def run_seed_bench(variant: Variant, cfg: RunConfig, device: torch.device, dtype: str, group_sizes: list[int],
                   steps: int, warmup: int, registry: Registry, log: Callable[[str], None] | None = None,
                   compile_mode: str | None = None) -> tuple[list[dict], dict[str, Any]]:
    """Time the arms of :func:`arms` for ``variant`` (see the module docstring).

    Args:
        group_sizes: the K of the vectorised (and captured) arms, each >= 1.
        steps: timed rounds (>= 1); warmup: untimed rounds first (>= 0; a captured arm captures
            its graph in its first round, a compiled arm compiles in it).
        compile_mode: a :data:`harness.perf.bench.COMPILE_MODES` entry without CUDA graphs (``default``,
            ``max-autotune-no-cudagraphs``): also the arms ``compiled K`` (the group's step through
            ``torch.compile``) and, on CUDA, ``compiled captured K`` (that compiled step captured as a
            CUDA graph by :class:`harness.vstep.CapturedStep`); None: not.

    Returns:
        ``(rows, info)``: one row per arm (:func:`seed_rows`); ``{"peak_gflop_per_s", "peak_n",
        "tokens_per_step", "bench_s"}``.
    """
    say = log or (lambda _line: None)
    t_start = time.perf_counter()
    tc, mc = cfg.train, cfg.model
    task = registry.task(tc.task).for_config(cfg)
    kmax = max(group_sizes + [1])
    gens = [torch.Generator().manual_seed(s) for s in range(kmax)]
    built = {(kind, k): _Arm(kind, k, variant, cfg, registry, device, dtype, compile_mode)
             for kind, k in arms(group_sizes, device, compile_mode)}
    first = task.make_batch(tc.batch, tc.seq_len, mc.vocab, gens[0])
    flops = count_flops(built[("sequential", 1)].model, first.to(device), cfg, device, dtype)
    n = PEAK_N.get(device.type, 2048)
    matmul_seconds(dtype, device, n)
    peak: list[float] = []
    order = list(built)
    for r in range(warmup + steps):
        batches = [task.make_batch(tc.batch, tc.seq_len, mc.vocab, g) for g in gens]
        t_round = time.perf_counter()
        for key in order[r % len(order):] + order[:r % len(order)]:
            try:
                t = built[key].step(batches)
            except Exception as exc:  # noqa: BLE001 - a capture or compile that fails drops its arm, not the bench
                if key[0] in ("sequential", "vectorised"):
                    raise
                say(f"{arm_name(*key)} dropped: {type(exc).__name__}: {str(exc)[:200]}")
                order.remove(key)
                del built[key]
                continue
            if r >= warmup:
                built[key].times.append(t)
        s = matmul_seconds(dtype, device, n)
        if r >= warmup:
            peak.append(s)
        say(f"round {r + 1}/{warmup + steps}{' (warm-up)' if r < warmup else ''}: {time.perf_counter() - t_round:.1f} s")
    peak_gflops = 2 * n ** 3 / statistics.median(peak) / 1e9
    for arm in built.values():  # after the timed rounds: the counter slows what it counts
        arm.op_count = arm.ops(batches)
    rows = seed_rows(list(built.values()), flops, first.ntokens, peak_gflops, tc.steps)
    return rows, {"peak_gflop_per_s": {dtype: peak_gflops}, "peak_n": n, "tokens_per_step": first.ntokens,
                  "bench_s": time.perf_counter() - t_start}


def seed_rows(arms_: list, flops: int, tokens: int, peak_gflops: float, trial_steps: int) -> list[dict]:
    """One row per arm: ``arm``, ``K``, ``dtype``, ``params``, ``step_ms_median`` (one step of the arm,
    all K seeds), ``ms_per_seed_step``, ``seed_steps_per_s``, ``vs_sequential`` (seed-steps/s over the
    sequential arm's), ``trials_per_h`` (3600 / (ms_per_seed_step x ``trial_steps``), training steps
    only), ``tokens_per_s`` (label tokens of all K seeds), ``achieved_gflop_per_s``, ``mfu``,
    ``ops_per_step`` (the arm's ``op_count``: ops that do work in one step, all K seeds; None when not counted)."""
    rows = []
    for a in arms_:
        med = statistics.median(a.times)
        per_seed = med / a.k
        achieved = flops * a.k / med / 1e9
        rows.append({"arm": arm_name(a.kind, a.k), "kind": a.kind, "K": a.k, "dtype": a.dtype, "params": a.params,
                     "steps_timed": len(a.times), "step_ms_median": med * 1e3, "ms_per_seed_step": per_seed * 1e3,
                     "seed_steps_per_s": 1.0 / per_seed, "trials_per_h": 3600.0 / (per_seed * trial_steps),
                     "tokens_per_s": tokens * a.k / med, "gflop_per_seed_step": flops / 1e9,
                     "achieved_gflop_per_s": achieved, "peak_gflop_per_s": peak_gflops, "mfu": achieved / peak_gflops,
                     "ops_per_step": getattr(a, "op_count", None)})
    seq = next(r for r in rows if r["kind"] == "sequential")
    for r in rows:
        r["vs_sequential"] = r["seed_steps_per_s"] / seq["seed_steps_per_s"]
    return rows


#: The printed table: (column, header, format).
SEED_TABLE = [("arm", "arm", "{}"), ("dtype", "dtype", "{}"), ("step_ms_median", "step ms", "{:.2f}"),
              ("ms_per_seed_step", "ms / seed-step", "{:.3f}"), ("seed_steps_per_s", "seed-steps/s", "{:,.0f}"),
              ("vs_sequential", "x sequential", "{:.2f}"), ("trials_per_h", "trials/h (train steps)", "{:,.0f}"),
              ("achieved_gflop_per_s", "GFLOP/s", "{:,.1f}"), ("mfu", "MFU", "{:.1%}"),
              ("ops_per_step", "ops / step", "{:,}")]


def _fmt(f: str, x) -> str:
    """``f`` for strings and large numbers; 3 significant digits for rates below 100."""
    if isinstance(x, float) and f in ("{:,.0f}", "{:,.1f}") and abs(x) < 100:
        return f"{x:.3g}"
    return f.format(x)


def seed_table(rows: list[dict]):
    """The rows as a formatted pandas DataFrame (:data:`SEED_TABLE`)."""
    import pandas as pd

    return pd.DataFrame([{h: "" if r.get(c) is None else _fmt(f, r[c]) for c, h, f in SEED_TABLE} for r in rows])
