"""Training speed of one variant under two sets of settings, side by side (``bench --old ...``).

The *old* arm is the config with ``--old KEY=VALUE`` overrides in ``--old-dtype``; the *new* arm
is the config as given in ``--dtype``. Each arm has its own model (same seed, same initial
weights), optimizer and training stream (:meth:`harness.Task.batches` of its own config, seed 0),
and takes exactly the step of a trial (:func:`harness.train.train_step`). Rounds are interleaved
with the order rotated every round, so a shared machine's slow phases hit both arms alike.

Rates: label tokens per second = the label tokens of the timed steps / their summed wall time
(batches of a bucketed stream hold different numbers of tokens, so a median step time alone
would not do); the ratio new / old is what ``docs/benchmarks.md`` records.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from .flops import sync
from ..config import RunConfig
from ..env import trial_settings
from ..model import build_model
from ..registry import Registry, Variant
from ..recipe import make_optimizer
from ..train import train_step


@dataclass
class Arm:
    """One setting under test: its config, dtype, model, optimizer and stream; per-step records."""

    name: str
    cfg: RunConfig
    dtype: str
    changes: str
    model: torch.nn.Module
    opt: object
    sched: object
    stream: object
    step_s: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    padded: list[int] = field(default_factory=list)


def _arm(name: str, cfg: RunConfig, dtype: str, changes: str, variant: Variant, registry: Registry,
         device: torch.device) -> Arm:
    model = build_model(registry, variant, cfg.model, seed=0).to(device)
    opt, sched = make_optimizer(model, cfg)
    stream = registry.task(cfg.train.task).for_config(cfg).batches(cfg, torch.Generator().manual_seed(0))
    return Arm(name, cfg, dtype, changes, model, opt, sched, stream)


def run_settings_bench(variant: Variant, old: RunConfig, new: RunConfig, old_dtype: str, new_dtype: str,
                       old_changes: str, registry: Registry, device: torch.device, steps: int, warmup: int,
                       log: Callable[[str], None] | None = None) -> list[dict]:
    """Interleaved timed training steps of ``variant`` under ``old`` and ``new`` (module docstring).

    Returns:
        One row per arm: ``arm``, ``changes``, ``dtype``, ``steps_timed``, ``step_ms_median``,
        ``tokens_per_step`` (mean label tokens), ``padded_per_step`` (mean decoder positions incl.
        pad), ``tokens_per_s``, ``vs_old`` (tokens/s / the old arm's).
    """
    say = log or (lambda _line: None)
    trial_settings()
    arms = [_arm("old", old, old_dtype, old_changes, variant, registry, device),
            _arm("new", new, new_dtype, "as configured", variant, registry, device)]
    for r in range(warmup + steps):
        t_round = time.perf_counter()
        for arm in arms[r % 2:] + arms[:r % 2]:
            batch = next(arm.stream).to(device)
            arm.model.train()
            t0 = time.perf_counter()
            train_step(arm.model, batch, arm.opt, arm.sched, arm.cfg, device, arm.dtype)
            sync(device)
            if r >= warmup:
                arm.step_s.append(time.perf_counter() - t0)
                arm.tokens.append(batch.ntokens)
                arm.padded.append(batch.tgt.numel())
        say(f"round {r + 1}/{warmup + steps}{' (warm-up)' if r < warmup else ''}: "
            f"{time.perf_counter() - t_round:.2f} s")
    rows = [{"arm": a.name, "changes": a.changes, "dtype": a.dtype, "steps_timed": len(a.step_s),
             "step_ms_median": 1e3 * statistics.median(a.step_s),
             "tokens_per_step": sum(a.tokens) / len(a.tokens), "padded_per_step": sum(a.padded) / len(a.padded),
             "tokens_per_s": sum(a.tokens) / sum(a.step_s)} for a in arms]
    for row in rows:
        row["vs_old"] = row["tokens_per_s"] / rows[0]["tokens_per_s"]
    return rows


def settings_table(rows: list[dict]):
    """The rows as a printable DataFrame of strings."""
    import pandas as pd

    return pd.DataFrame([{"arm": r["arm"], "settings": r["changes"], "dtype": r["dtype"],
                          "steps timed": r["steps_timed"], "step ms (median)": f"{r['step_ms_median']:.1f}",
                          "label tokens/step": f"{r['tokens_per_step']:.0f}",
                          "decoder positions/step": f"{r['padded_per_step']:.0f}",
                          "target tokens/s": f"{r['tokens_per_s']:,.0f}", "x old": f"{r['vs_old']:.2f}"}
                         for r in rows])
