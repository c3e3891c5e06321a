"""``python -m harness run``: train variants x seeds on the copy task and write a report."""
from __future__ import annotations

import shlex
import sys
import time

from ..errors import ConfigError
from ..report import summary_table, to_markdown, write_report
from ..runner import Plan, execute_sequential, make_specs
from ..store import RunStore, config_hash
from ..train import environment, resolve_device
from .common import add_config, add_selection, load_registry, resolve_config, select_variants

DESCRIPTION = """Train every selected variant on the copy task with one shared loop, store each
trial the moment it finishes under results/<run-id>/ (trials/, trials.csv, curves.csv,
config.json) and print the comparison table (also in report.md)."""


def register(sub, parents):
    p = sub.add_parser("run", parents=parents, help="train variants on the copy task and write a report",
                       description=DESCRIPTION)
    add_selection(p)
    add_config(p)
    p.add_argument("--experiment", metavar="NAME", default=None,
                   help="run a declarative experiment from experiments/NAME.toml (see: python -m harness experiments)")
    p.add_argument("--seeds", type=int, default=1, metavar="N", help="seeds per variant: 0..N-1 (default 1)")
    p.add_argument("--seed-start", type=int, default=0, metavar="S", help="first seed (default 0)")
    p.add_argument("--results-dir", default="results", metavar="DIR", help="where runs are stored (default results)")
    p.add_argument("--run-id", default=None, help="name of the run folder (default: a timestamp)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bars or per-trial log lines")
    p.set_defaults(func=main)


def command_line() -> str:
    return "python -m harness " + shlex.join(sys.argv[1:])


def plan_from_args(args, reg) -> Plan:
    """The run's plan from --experiment, or from --variants/--grid, --preset/--set and --seeds."""
    if args.experiment:
        from ..experiments import plan_from_experiment

        return plan_from_experiment(args.experiment, reg, args)
    cfg = resolve_config(args)
    if args.seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {args.seeds}")
    seeds = list(range(args.seed_start, args.seed_start + args.seeds))
    return Plan(select_variants(reg, args), seeds, [("", cfg)], preset=args.preset)


def main(args) -> int:
    reg = load_registry(args)
    plan = plan_from_args(args, reg)
    variants, seeds, cfg = plan.variants, plan.seeds, plan.config
    device = resolve_device(args.device)
    from ..cli import plugin_spec

    plugins = plugin_spec(args).to_dict()
    specs = make_specs(variants, seeds, cfg, device.type, args.dtype, plugins, points=plan.points)
    meta = {
        "command": command_line(), "preset": plan.preset, "experiment": plan.name, "config": cfg.to_dict(),
        "points": {name: c.to_dict() for name, c in plan.points if name},
        "config_hash": config_hash(cfg.to_dict()), "variants": [v.name for v in variants], "seeds": seeds,
        "device": device.type, "dtype": args.dtype, "plugins": plugins, "environment": environment(device),
        "trials": [{"key": s.key, "spec": s.spec} for s in specs],
    }
    store = RunStore.create(args.results_dir, meta, args.run_id)
    log = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    if log:
        log(f"run {store.root}: {len(variants)} variant(s) x {len(seeds)} seed(s) x {len(plan.points)} "
            f"config(s) = {len(specs)} trial(s) on {device.type}")
    t0 = time.perf_counter()
    interrupted = False
    try:
        results = execute_sequential(specs, store, quiet=args.quiet, log=log)
    except KeyboardInterrupt:
        interrupted = True
        results = []
    meta["run_wall_s"] = time.perf_counter() - t0
    store.write_meta(meta)
    report = write_report(store)
    if interrupted:
        done = len(store.done_keys())
        print(f"harness: interrupted; {done} of {len(specs)} trials are stored in {store.root}; "
              f"resume with: python -m harness run --resume {store.root}", file=sys.stderr)
        return 130
    from ..report import trials_frame

    print(to_markdown(summary_table(trials_frame(store))))
    print(f"\nreport: {report}  ({meta['run_wall_s']:.1f} s)")
    bad = [r["row"] for r in results if r["row"].get("status") != "ok"]
    if bad:
        print(f"harness: {len(bad)} trial(s) did not finish ok: "
              + "; ".join(f"{r['variant']} s{r['seed']} {r['status']} ({r.get('reason', '')})" for r in bad),
              file=sys.stderr)
        return 1
    return 0
