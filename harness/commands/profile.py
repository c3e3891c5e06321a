"""``python -m harness profile``: the harness's own share of a trial's wall time (torch.profiler).

Heavy imports (torch, pandas) happen inside :func:`main`, so ``python -m harness list`` stays fast.
"""
from __future__ import annotations

import sys
import textwrap
from typing import TYPE_CHECKING

from .common import add_config, add_output, add_selection

if TYPE_CHECKING:
    from ..runmeta import RunMeta

DESCRIPTION = """Run one trial per selected variant exactly as 'python -m harness run' does (same
loop, evaluation and storing; in this process, all cores) and split its wall time into the phases
the training loop times and marks for torch.profiler: build, data, step (the model's forward,
backward and optimizer), log, evaluate, final_eval, store. Everything but 'step' is the harness's
overhead, which should stay at or below 5% of the trial's wall time. --torch-profiler also runs the
trial under torch.profiler and reports its range totals next to the clock's (short trials: the
profiler keeps every op's event). Prints a table and writes profile.csv and profile.md (command,
environment, table) under results/<run-id>/, next to the trials' JSON."""

EPILOG = """examples:
  python -m harness profile --variants baseline --preset paper     the Annotated copy config, 400 steps
  python -m harness profile --variants baseline pre_norm           the quick preset
  python -m harness profile --variants baseline --torch-profiler   quick preset, cross-checked by torch.profiler
  python -m harness profile --variants baseline --count-ops        ops per phase: what a GPU trial launches"""


def register(sub, parents):
    import argparse

    p = sub.add_parser("profile", parents=parents,
                       help="the harness's own overhead in a trial (phase clock; optional torch.profiler, op counts)",
                       description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_selection(p, default="baseline")
    add_config(p)
    p.add_argument("--seed", type=int, default=0, help="the trial's seed (default 0)")
    p.add_argument("--torch-profiler", action="store_true",
                   help="also run under torch.profiler and report its range totals (memory: a few GB for a "
                        "400-step paper trial; fine for the quick preset)")
    p.add_argument("--count-ops", action="store_true",
                   help="also count the aten ops each phase dispatches that do work (views, allocations and "
                        "composites' own entries left out): about one kernel launch "
                        "each on a GPU, so a CPU run shows what an uncaptured GPU trial launches (the trial runs "
                        "a few times slower; its seconds read higher)")
    add_output(p, "profile")
    p.set_defaults(func=main)


def _markdown(frame) -> str:
    """The phase table as GitHub markdown; a cell a row has no value for stays empty (not ``nan``)."""
    return frame.astype(object).where(frame.notna(), None).to_markdown(index=False, tablefmt="github",
                                                                       floatfmt=".3f", missingval="")


def render_markdown(frame, lines: list[str], meta: RunMeta) -> str:
    """profile.md: command, environment, config, the phase table and the verdicts."""
    import json

    from ..perf.overhead import OVERHEAD_TARGET

    env = meta.environment
    out = [f"# Harness overhead per trial ({meta.preset or 'custom'} config)", "", "```", meta.command, "```", "",
           "## Environment", ""]
    out += [f"- {k}: {v}" for k, v in env.items() if v is not None]
    out += ["", "## Config", "", "```json"] + [f'"{k}": {json.dumps(v)}' for k, v in meta.config.items()]
    out += ["```", "", "## Phases", "", _markdown(frame), "",
            "## Summary", ""] + [f"- {line}" for line in lines]
    out += ["", "## How to read this", "",
            "- Each trial ran as `harness run` runs it (`harness.train.run_trial`, then the trial's JSON written "
            "by `RunStore`), in this process with all cores.",
            "- `seconds` of a phase: wall time summed by the loop's `PhaseClock` (`time.perf_counter` around "
            "each block); `share`: of the trial's wall time; `torch.profiler s` (with `--torch-profiler`): "
            "the same blocks' `record_function` range totals as the profiler saw them (CPU wall time).",
            f"- overhead = wall - step; the target is <= {OVERHEAD_TARGET:.0%}. Under `--torch-profiler` every op "
            "is recorded, which slows `step` (small-op models most), so its overhead share reads lower.",
            "- `ops` (with `--count-ops`): the aten ops each phase dispatched that do work (views, allocations and "
            "composites' own entries left out: `harness.perf.overhead.launches_work`); on a GPU each is about "
            "one kernel launch, so this counts what an "
            "uncaptured trial launches on any device. The counter is a Python call per op: under it the seconds "
            "read higher than in a plain run.",
            ""]
    return "\n".join(out)


def main(args) -> int:
    import pandas as pd

    from .common import plugin_spec
    from ..perf.overhead import profile_rows, profile_trial, verdict
    from ..runner import make_specs
    from ..env import environment, resolve_device
    from ..runmeta import RunMeta
    from ..store import RunStore, atomic_write_text
    from .common import command_line, load_registry, resolve_config, select_variants

    reg = load_registry(args)
    variants = select_variants(reg, args)
    cfg = resolve_config(args, reg)
    device = resolve_device(args.device)
    plugins = plugin_spec(args).to_dict()
    specs = make_specs(variants, [args.seed], cfg, device.type, args.dtype, plugins)
    command = command_line()
    meta = RunMeta("profile", command, args.preset, cfg.to_dict(), [v.name for v in variants], device.type,
                   environment(device, trial_settings_applied=True),  # the profiled trials apply them
                   seeds=[args.seed], dtype=args.dtype, plugins=plugins)
    store = RunStore.create(args.results_dir, meta, args.run_id, prefix="profile-")  # taken: -2, -3 ...
    log = None if args.quiet else (lambda line: print(f"profile: {line}", file=sys.stderr, flush=True))
    rows, lines = [], []
    for ts in specs:
        if log:
            log(f"{ts.variant}: one trial under torch.profiler ...")
        result, prof = profile_trial(ts, lambda r, key=ts.key: store.write_trial(key, r),
                                     torch_profiler=args.torch_profiler, count_ops=args.count_ops)
        row = result.row
        if result.status != "ok" and log:
            log(f"{ts.variant}: trial {result.status}: {result.reason}")
        rows += profile_rows(ts.variant, prof)
        line = verdict(ts.variant, prof)
        line += f"; trial row: train_s {row.get('train_s', float('nan')):.1f} s, wall_s {row.get('wall_s', float('nan')):.1f} s, "
        line += f"exact-match {row.get('exact_match', float('nan')):.3f}"
        if "profiler_phases" in prof:
            pp = prof["profiler_phases"]
            share = 1 - pp["step"]["s"] / prof["wall_s"]
            line += (f"; torch.profiler ranges: overhead {share:.1%} (its own start-up and post-processing "
                     f"{prof['profiler_s']:.1f} s, not counted)")
        lines.append(line)
        if log:
            log(line)
        frame = pd.DataFrame(rows)
        atomic_write_text(store.root / "profile.csv", frame.to_csv(index=False))
        atomic_write_text(store.root / "profile.md", render_markdown(frame, lines, meta))
    frame = pd.DataFrame(rows)
    print(_markdown(frame.drop(columns=["what"])))
    print()
    from ..report.terminal import WIDTH

    for line in lines:  # one verdict a variant, wrapped to the terminal's 120 columns
        print(textwrap.fill(line, WIDTH, subsequent_indent="    "))
    print(f"\nprofile: {store.root / 'profile.md'}")
    return 0
