"""Evaluation time per seed: a trial group's seeds evaluated one after another vs in one batched pass.

``python -m harness bench --group-sizes 4,8 --eval`` times, in one process and interleaved
round-robin (every arm once per round, order rotated each round), the final held-out evaluation of a
trial (the task's ``evaluate`` on ``train.eval_sequences`` sequences of its evaluation set: prefix-only
CE, token accuracy, exact match and, for ``g2p``, free-running decoding with WER/PER):

* ``sequential``: the K_max models of the variant (seeds 0..K_max-1) evaluated one after another on
  their own models, as a sequential trial or a group without batching does (one call per seed);
* ``batched K``: the first K of them as one stack (:class:`harness.tasks.seeds.SeedStack`), all K
  seeds in one pass (:func:`harness.tasks.seeds.evaluate_seeds`, what a trial group of K seeds runs).

Each row gives the median time of one evaluation of the arm's seeds, the time per seed and the
speed-up over ``sequential`` per seed. On the CPU every arm runs on one intra-op thread (as each
trial of ``run --jobs auto`` does; a second thread on small decoding ops mostly measures contention).
The models are freshly initialised (not trained): free-running
decoding runs each row until its end symbol or the task's length limit, in both arms alike.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch

from .flops import sync
from ..config import RunConfig
from ..env import threads_pinned
from ..model import build_model
from ..registry import Registry, Variant
from ..tasks.seeds import SeedStack, evaluate_seeds


def run_eval_bench(variant: Variant, cfg: RunConfig, device: torch.device, dtype: str, group_sizes: list[int],
                   rounds: int, warmup: int, registry: Registry,
                   log: Callable[[str], None] | None = None) -> tuple[list[dict], dict[str, Any]]:
    """Time the sequential arm and one batched arm per K of ``group_sizes`` (module docstring).

    Args:
        group_sizes: the K of the batched arms, each >= 1.
        rounds: timed rounds (>= 1); warmup: untimed rounds first (>= 0).

    Returns:
        ``(rows, info)``: one row per arm (``arm``, ``K``, ``dtype``, ``rows``, ``threads``, ``eval_ms_median``,
        ``ms_per_seed``, ``vs_sequential``); ``{"eval_rows", "bench_s"}``.

    Raises:
        NotBatched: the task scores with its own ``evaluate`` (nothing to batch).
    """
    say = log or (lambda _line: None)
    t_start = time.perf_counter()
    tc, mc = cfg.train, cfg.model
    task = registry.task(tc.task).for_config(cfg)
    kmax = max(group_sizes)
    models = [build_model(registry, variant, mc, seed=s).to(device).eval() for s in range(kmax)]
    tensors = {n: torch.stack([dict(m.named_parameters())[n].detach() for m in models])
               for n, _ in models[0].named_parameters()}
    tensors.update({n: torch.stack([dict(m.named_buffers())[n] for m in models]) for n, _ in models[0].named_buffers()})
    data = task.eval_set(tc.eval_sequences, tc.seq_len, mc.vocab, tc.eval_seed)
    stacks = {k: SeedStack(models[0], {n: t[:k] for n, t in tensors.items()}, mc.pad) for k in group_sizes}

    def sequential() -> None:
        for m in models:
            task.evaluate(m, data, cfg, device, dtype)

    arms: dict[tuple[str, int], Callable[[], Any]] = {("sequential", kmax): sequential}
    for k, stack in stacks.items():
        arms[("batched", k)] = lambda stack=stack: evaluate_seeds(task, stack, data, cfg, device, dtype)
    with threads_pinned(1 if device.type == "cpu" else None) as threads:
        times = _time_arms(arms, rounds, warmup, device, say)
    rows = []
    for (kind, k), ts in times.items():
        med = statistics.median(ts)
        rows.append({"arm": kind if kind == "sequential" else f"batched K={k}", "K": k, "dtype": dtype,
                     "rows": data.src.size(0), "rounds": len(ts), "threads": threads, "eval_ms_median": med * 1e3,
                     "ms_per_seed": med * 1e3 / k})
    seq = rows[0]["ms_per_seed"]
    for row in rows:
        row["vs_sequential"] = seq / row["ms_per_seed"]
    return rows, {"eval_rows": data.src.size(0), "bench_s": time.perf_counter() - t_start}


def _time_arms(arms: dict, rounds: int, warmup: int, device: torch.device, say: Callable[[str], None]) -> dict:
    """Each arm once per round, the order rotated each round; the timed rounds' seconds per arm."""
    times: dict[tuple[str, int], list[float]] = {key: [] for key in arms}
    order = list(arms)
    for r in range(warmup + rounds):
        for key in order[r % len(order):] + order[:r % len(order)]:
            sync(device)
            t0 = time.perf_counter()
            arms[key]()
            sync(device)
            if r >= warmup:
                times[key].append(time.perf_counter() - t0)
        say(f"evaluation round {r + 1}/{warmup + rounds}{' (warm-up)' if r < warmup else ''}")
    return times


#: The printed table: (column, header, format).
EVAL_TABLE = [("arm", "arm", "{}"), ("dtype", "dtype", "{}"), ("rows", "eval rows", "{}"),
              ("eval_ms_median", "ms (all K seeds)", "{:.1f}"), ("ms_per_seed", "ms / seed", "{:.1f}"),
              ("vs_sequential", "x sequential", "{:.2f}")]


def eval_table(rows: list[dict]):
    """The rows as a formatted pandas DataFrame (:data:`EVAL_TABLE`)."""
    import pandas as pd

    return pd.DataFrame([{h: f.format(r[c]) for c, h, f in EVAL_TABLE} for r in rows])
