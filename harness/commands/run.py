"""``python -m harness run``: train variants x seeds on a task (``--task``, default copy) and write a report.

Every finished trial is stored at once and atomically under ``results/<run-id>/trials/``, so a
run killed at any moment loses no finished trial; ``--resume results/<run-id>`` runs only the
missing ones. ``--jobs N`` runs trials in N local worker processes, ``--executor ray`` on a Ray
cluster (see :mod:`harness.executors` and docs/running.md).

Exit codes: 0 every trial ok; 1 some trial failed or diverged (the report lists them);
2 bad input (one line on stderr, nothing stored is touched); 130 interrupted by Ctrl-C or
SIGTERM (the message says how to resume).
"""
from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
import time

from ..errors import ConfigError
from ..experiments import plan_from_experiment
from ..experiments import write_run_report as write_report  # a run's report with its experiment's sections
from ..plugins import PluginSpec, plugin_spec
from ..registry import Registry
from ..report import summary_table, to_markdown, trials_frame
from ..runner import ExecutionOptions, Plan, PlannedTrial, check_plan_size, execute, make_specs
from ..resume import (check_code_config, check_components, check_plugins, check_points, check_setting, check_trials,
                      stored_specs)
from ..store import RunMeta, RunStore, config_hash
from ..tasks.base import heldout_note
from ..env import environment, resolve_device
from .common import (add_config, add_output, add_selection, check_task, command_line, load_registry, resolve_config,
                     select_variants)

DESCRIPTION = """Train every selected variant on a task (--task, default copy) with one shared loop, store each
trial the moment it finishes under results/<run-id>/ (trials/, trials.csv, curves.csv,
config.json) and print the comparison table (also in report.md). An interrupted or killed run
continues with --resume results/<run-id>."""

EPILOG = """examples:
  python -m harness run --variants all --preset tiny -q
  python -m harness run --variants 'seed_*' --seeds 5 --jobs 2
  python -m harness run --variants baseline pre_norm --task reverse
  python -m harness run --resume results/20250101-120000        only the missing trials
  python -m harness run --executor ray --address ray://head:10001

exit codes: 0 all trials ok, 1 a trial failed or diverged, 2 bad input, 130 interrupted"""

#: Options whose defaults are filled in only after recording which ones the user gave, so
#: that ``--resume`` can tell "asked for X" from "did not say". name -> default.
PLAN_DEFAULTS = {"variants": "all", "preset": "quick", "seeds": 1, "seed_start": 0}
DEVICE_DEFAULTS = {"device": "auto", "dtype": "fp32"}
EXEC_DEFAULTS = {"executor": "local", "jobs": "auto"}
CONFIG_OPTIONS = {"preset", "overrides", "experiment"}
TRIAL_OPTIONS = {"variants", "grid", "seeds", "seed_start", "experiment"}


def register(sub, parents):
    p = sub.add_parser("run", parents=parents, help="train variants on a task (default copy) and write a report",
                       description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_selection(p)
    add_config(p)
    p.add_argument("--experiment", metavar="NAME", default=None,
                   help="run a declarative experiment from experiments/NAME.toml (see: python -m harness experiments)")
    p.add_argument("--no-check", dest="check", action="store_false",
                   help="skip recording check's equivalence classes of the variants (a few seconds before training; "
                        "the report opens with them)")
    p.add_argument("--suite", nargs="?", const="default", default=None, metavar="NAME",
                   help="run the suite experiments/suites/NAME.toml (default: default): every variant it names "
                        "on every task it names with paired seeds, one report with verdicts (suite.md)")
    p.add_argument("--seeds", type=int, metavar="N", help="seeds per variant: 0..N-1 (default 1)")
    p.add_argument("--seed-start", type=int, metavar="S", help="first seed (default 0)")
    add_output(p, "run", what="run", default_id="a timestamp",
               quiet_help="no progress bars or per-trial log lines (bars are off anyway when stderr is not a terminal)")
    g = p.add_argument_group("resume and execution")
    g.add_argument("--resume", metavar="RUN_DIR", default=None,
                   help="continue the run stored in RUN_DIR (results/<run-id>): run only its missing trials; "
                        "refused when the config differs from the stored one")
    g.add_argument("--jobs", "-j", type=jobs_arg, metavar="N",
                   help="run trials in N local worker processes, each with max(1, cores // N) threads; 'auto' "
                        "(default): on the CPU one process per core with 1 thread each, else 1. Use --jobs 1 "
                        "when the trials' own timings matter")
    g.add_argument("--executor", choices=["local", "ray"],
                   help="local (this machine; default) or ray (a Ray cluster: pip install -e '.[ray]')")
    g.add_argument("--address", metavar="ADDR", default=None,
                   help="Ray cluster address, e.g. ray://head:10001 or head:6379 (default: RAY_ADDRESS, "
                        "else a private local cluster)")
    g.add_argument("--threads", type=int, metavar="T", default=None,
                   help="torch threads per trial (default: cores // jobs locally, 1 per Ray task); "
                        "results are bitwise reproducible for the same threads")
    p.set_defaults(func=main, **{k: None for k in (*PLAN_DEFAULTS, *DEVICE_DEFAULTS, *EXEC_DEFAULTS)})


def jobs_arg(text: str) -> int | str:
    """``--jobs``: a positive integer or ``auto``."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of processes or 'auto', got {text!r}") from None


def given_options(args) -> set[str]:
    """Names of the run options the user gave explicitly (before defaults are filled in)."""
    names = {n for n in (*PLAN_DEFAULTS, *DEVICE_DEFAULTS, *EXEC_DEFAULTS, "threads", "address", "experiment")
             if getattr(args, n, None) is not None}
    if getattr(args, "grid", False):
        names.add("grid")
    if getattr(args, "overrides", None):
        names.add("overrides")
    if any(getattr(args, n, None) for n in ("plugin_modules", "plugin_files", "strict_plugins")):
        names.add("plugins")
    return names


def fill_defaults(args) -> None:
    for name, default in {**PLAN_DEFAULTS, **DEVICE_DEFAULTS, **EXEC_DEFAULTS}.items():
        if getattr(args, name, None) is None:
            setattr(args, name, default)


def execution_options(args) -> ExecutionOptions:
    """``--executor/--jobs/--threads/--address`` validated; Ray imported early when asked for,
    so a missing Ray is reported before anything is stored."""
    opts = ExecutionOptions(args.executor, args.jobs, args.threads, args.address).validate()
    if opts.executor == "ray":
        from ..executors import import_ray

        import_ray()
    return opts


def check_seeds(seeds: int, seed_start: int) -> None:
    """``--seeds`` >= 1 and ``--seed-start`` >= 0 (seeds are non-negative, as in experiment files).

    Raises:
        ConfigError: naming the option and the value.
    """
    if seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {seeds}")
    if seed_start < 0:
        raise ConfigError(f"--seed-start must be >= 0, got {seed_start}")


def plan_from_args(args, reg) -> Plan:
    """The run's plan from --experiment, or from --variants/--grid, --preset/--set and --seeds."""
    if args.experiment:
        return plan_from_experiment(args.experiment, reg, args)
    cfg = resolve_config(args)
    check_seeds(args.seeds, args.seed_start)
    variants = select_variants(reg, args)
    check_plan_size(len(variants), args.seeds)
    seeds = list(range(args.seed_start, args.seed_start + args.seeds))
    return Plan(variants, seeds, [("", cfg)], preset=args.preset)


def log_function(quiet: bool):
    """Where log lines go: stderr, flushed at once (None with ``--quiet``)."""
    return None if quiet else (lambda line: print(line, file=sys.stderr, flush=True))


def executor_session(options: ExecutionOptions, plugins: dict, quiet: bool):
    """For ``--executor ray``: connect to (or start) the cluster before anything is stored, so an
    unreachable cluster is one line and exit 2 with no run folder left behind."""
    if options.executor != "ray":
        return contextlib.nullcontext()
    from ..executors import ray_session

    modules = PluginSpec.from_dict(plugins).module_names()  # the -p modules to ship, not -p no:NAME
    return ray_session(options.address, modules, log_function(quiet))


def device_name(name: str, options: ExecutionOptions) -> str:
    """The device the trials use. On Ray an explicit ``cuda`` is checked on the workers, not here
    (the driver may have no GPU); everything else must be available on this machine."""
    if options.executor == "ray" and name.startswith("cuda"):
        return "cuda"
    return resolve_device(name).type


def check_experiment_options(given: set[str]) -> None:
    """With ``--experiment`` the file decides the variants and the preset: ``--variants``,
    ``--grid`` and ``--preset`` are refused rather than ignored, and ``--seed-start`` needs
    ``--seeds``.

    Raises:
        ConfigError: naming the option.
    """
    for name, flag in (("variants", "--variants"), ("grid", "--grid"), ("preset", "--preset")):
        if name in given:
            raise ConfigError(f"{flag} cannot be combined with --experiment: the experiment file decides its "
                              f"variants and preset (override its config with --set KEY=VALUE, its seeds with "
                              f"--seeds N)")
    if "seed_start" in given and "seeds" not in given:
        raise ConfigError("--seed-start with --experiment needs --seeds N (without it the file's seeds are used)")


def main(args, finish=None) -> int:
    """``python -m harness run``: plan, store and execute the trials (or resume a run), write the
    report; ``finish`` (default :func:`print_outcome`) turns the outcome into the return value
    (:func:`harness.api.run` passes one that returns the run folder)."""
    given = given_options(args)
    if args.suite is not None:
        from .run_suite import main as suite_main

        return suite_main(args, given)
    if "experiment" in given:
        check_experiment_options(given)
    args.seeds_given = "seeds" in given
    fill_defaults(args)
    options = execution_options(args)
    if args.resume:
        return resume(args, given, options, finish)
    reg = load_registry(args)
    plan = plan_from_args(args, reg)
    for _, point in plan.points:
        check_task(reg, point)
    if plan.measure is not None:
        return plan.measure(args, plan)
    device = device_name(args.device, options)
    options = options.resolved(len(plan.variants) * len(plan.seeds) * len(plan.points), device)
    plugins = plugin_spec(args).to_dict()
    specs = make_specs(plan.variants, plan.seeds, plan.config, device, args.dtype, plugins, points=plan.points,
                       threads=options.trial_threads())
    meta = run_meta(args, reg, plan, specs, device, options, plugins)
    with executor_session(options, plugins, args.quiet):  # a Ray cluster that cannot be reached stores nothing
        store = RunStore.create(args.results_dir, meta, args.run_id)
        meta["run_id"] = store.root.name
        if args.check and len([v for v in plan.variants if not v.buggy]) > 1:  # after bad input is refused
            meta["check"] = record_check(reg, plan.variants, args.quiet)
            store.write_meta(meta)
        with store.lock():
            return execute_and_report(store, specs, meta, options, args.quiet,
                                      f"run {store.root}: {len(plan.variants)} variant(s) x {len(plan.seeds)} seed(s) "
                                      f"x {len(plan.points)} config(s) = {len(specs)} trial(s) on {device}, "
                                      f"{options.describe()}", finish=finish)


def run_meta(args, reg, plan: Plan, specs: list[PlannedTrial], device: str, options: ExecutionOptions,
             plugins: dict) -> dict:
    """The new run's ``config.json`` (the run metadata, a :class:`harness.store.RunMeta`) before any
    trial ran, as the dict the run updates and the store writes."""
    cfg, seeds = plan.config, plan.seeds
    return RunMeta(
        kind="train", command=command_line(args), preset=plan.preset, config=cfg.to_dict(),
        variants=[v.name for v in plan.variants], seeds=seeds, device=device, dtype=args.dtype, plugins=plugins,
        environment={**environment(device, trial_settings_applied=True), "threads": options.trial_threads()},
        extra={"experiment": plan.name, "points": {name: c.to_dict() for name, c in plan.points if name},
               "config_hash": config_hash(cfg.to_dict()), "execution": options.to_dict(), "status": "running",
               "trials": [{"key": s.key, "spec": s.spec} for s in specs],
               "heldout": heldout_note(reg.task(cfg.train.task), cfg, seeds[0]), **plan.meta},
    ).to_dict()


def record_check(reg, variants, quiet: bool) -> dict:
    """check's equivalence classes of ``variants`` (:func:`harness.overview.check_classes`), with one
    log line naming the classes that hold more than one variant."""
    from ..overview import check_classes

    result = check_classes(reg, variants)
    log = log_function(quiet)
    if log:
        multi = ["{" + ", ".join(c) + "}" for c in result["classes"] if len(c) > 1]
        what = (f"check could not group them: {result['error']}" if result.get("error") else
                f"{len(result['classes'])} class(es); same function: {'; '.join(multi) or 'none'}")
        log(f"check: {len(variants)} variant(s), {what} ({result['wall_s']:.1f} s)")
    return result


# ------------------------------------------------------------------------------------- resume

def check_requested(args, given: set[str], meta: dict, reg, specs: list[PlannedTrial], where: str) -> None:
    """Refuse when options given with ``--resume`` ask for other plugins, device, dtype, config or
    trials than the stored run (the comparisons are in :mod:`harness.resume`). Options not given
    take the stored values.

    Raises:
        StoreError: naming the first difference.
    """
    if not given & (CONFIG_OPTIONS | TRIAL_OPTIONS | {"device", "dtype", "plugins"}):
        return
    if "plugins" in given:
        check_plugins(plugin_spec(args).to_dict(), meta, where)
    if "device" in given:
        check_setting("device", device_name(args.device, ExecutionOptions()), meta, where)
    if "dtype" in given:
        check_setting("dtype", args.dtype, meta, where)
    variants, seeds, points = requested_plan(args, given, meta, reg)
    if given & CONFIG_OPTIONS:
        check_points(points, meta, where)
    if given & TRIAL_OPTIONS:
        check_trials(variants, seeds, points, specs, where)


def requested_plan(args, given: set[str], meta: dict, reg) -> tuple[list[str], list[int], list]:
    """``(variant names, seeds, [(point name, RunConfig)])`` that the options given with
    ``--resume`` ask for; what was not given is taken from the stored run (``meta``).

    Raises:
        HarnessError: the given options themselves are bad (unknown variant, bad ``--set``, ...).
    """
    ns = argparse.Namespace(**vars(args))
    experiment = args.experiment if "experiment" in given else (meta.get("experiment") or None)
    if experiment:
        check_experiment_options(given)
    if "preset" not in given:
        ns.preset = meta.get("preset") or "quick"
    if experiment:
        ns.experiment = experiment
        plan = plan_from_args(ns, reg)
        return [v.name for v in plan.variants], plan.seeds, plan.points
    ns.experiment = None
    points = [("", resolve_config(ns))]
    variants = ([v.name for v in select_variants(reg, ns)] if given & {"variants", "grid"}
                else list(meta["variants"]))
    if given & {"seeds", "seed_start"}:
        check_seeds(ns.seeds, ns.seed_start)
        check_plan_size(len(variants), ns.seeds)
        seeds = list(range(ns.seed_start, ns.seed_start + ns.seeds))
    else:
        seeds = list(meta.get("seeds") or [])
    return variants, seeds, points


def resume(args, given: set[str], options: ExecutionOptions, finish=None) -> int:
    """``run --resume RUN_DIR``: run the stored run's missing trials, then re-render its report
    (validation: :mod:`harness.resume`)."""
    if args.run_id:
        raise ConfigError("--run-id cannot be combined with --resume (a resumed run keeps its folder)")
    store = RunStore.open(args.resume)
    meta = store.meta()
    specs = stored_specs(store, meta)
    where = str(store.root)
    check_code_config(store, meta, specs)
    reg = Registry.from_plugins(PluginSpec.from_dict(meta.get("plugins")))
    for w in reg.warnings:
        print(f"harness: warning: {w}", file=sys.stderr)
    check_components(reg, specs, where)
    check_requested(args, given, meta, reg, specs, where)
    if not given & {"executor", "jobs", "threads", "address"} and isinstance(meta.get("execution"), dict):
        stored = meta["execution"]
        options = execution_options(argparse.Namespace(
            executor=stored.get("executor", "local"), jobs=stored.get("jobs", 1), threads=stored.get("threads"),
            address=stored.get("address")))
    todo = [ts for ts in specs if ts.key in set(store.missing(ts.key for ts in specs))]
    options = options.resolved(len(todo), meta.get("device", "cpu"))
    with executor_session(options, meta.get("plugins") or {}, args.quiet), store.lock():
        meta.setdefault("resumes", []).append({"command": command_line(), "missing": len(todo),
                                               "execution": options.to_dict()})
        return execute_and_report(store, todo, meta, options, args.quiet,
                                  f"resume {store.root}: {len(specs) - len(todo)} of {len(specs)} trial(s) stored, "
                                  f"running the {len(todo)} missing on {meta.get('device', 'cpu')}, "
                                  f"{options.describe()}", total=len(specs), finish=finish)


# ----------------------------------------------------------------------------- execute + report

class Terminated(KeyboardInterrupt):
    """SIGTERM, turned into an interrupt so the run stops as cleanly as on Ctrl-C."""


def _on_sigterm(signum, frame):
    raise Terminated()


def execute_and_report(store: RunStore, specs: list[PlannedTrial], meta: dict, options: ExecutionOptions,
                       quiet: bool, headline: str, total: int | None = None, finish=None) -> int:
    """Execute ``specs`` into ``store``, re-render the report and return
    ``finish(store, meta, report, interrupted, total)`` (default :func:`print_outcome`: the exit code)."""
    total = len(specs) if total is None else total
    interrupted = execute_trials(store, specs, meta, options, quiet, headline)
    report = write_report(store)
    if not specs and interrupted is None and not quiet:
        log_function(quiet)(f"nothing to run: all {total} trial(s) of {store.root} are stored")
    return (finish or print_outcome)(store, meta, report, interrupted, total)


def execute_trials(store: RunStore, specs: list[PlannedTrial], meta: dict, options: ExecutionOptions, quiet: bool,
                   headline: str) -> KeyboardInterrupt | None:
    """Execute ``specs`` into ``store`` (SIGTERM stops it as Ctrl-C does) and store the run's
    wall time and status in its metadata. Returns the interrupt, if one stopped it."""
    log = log_function(quiet)
    if log:
        log(headline)
    main_thread = threading.current_thread() is threading.main_thread()
    old_term = signal.signal(signal.SIGTERM, _on_sigterm) if main_thread else None
    t0 = time.perf_counter()
    interrupted: KeyboardInterrupt | None = None
    try:
        if specs:
            execute(specs, store, options, quiet=quiet, log=log)
    except KeyboardInterrupt as exc:
        interrupted = exc
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, old_term)
    meta["run_wall_s"] = float(meta.get("run_wall_s") or 0.0) + time.perf_counter() - t0
    meta["status"] = "interrupted" if interrupted is not None else "complete"  # read by harness verify
    store.write_meta(meta)
    return interrupted


def print_outcome(store: RunStore, meta: dict, report, interrupted: KeyboardInterrupt | None, total: int) -> int:
    """The command line's ending: the summary table and report path on stdout, failures and how
    to resume on stderr. Returns the exit code (0 ok, 1 a trial not ok, 130 interrupted)."""
    done = len(store.done_keys() & {t["key"] for t in meta["trials"]})
    if interrupted is not None:
        what = "terminated (SIGTERM)" if isinstance(interrupted, Terminated) else "interrupted"
        print(f"harness: {what}; {done} of {total} trial(s) are stored in {store.root}; "
              f"resume with: python -m harness run --resume {store.root}", file=sys.stderr)
        return 130
    table = store.summary if store.summary is not None else summary_table(trials_frame(store))  # aggregated once
    print(to_markdown(table))
    print(f"\nreport: {report}  ({meta['run_wall_s']:.1f} s)")
    bad = [t["row"] for t in store.load_trials() if t["row"].get("status") != "ok"]
    if bad:
        invalid = sorted({r["variant"] for r in bad if r.get("status") == "invalid"})
        if invalid:
            print(f"harness: INVALID (excluded from every verdict; see the report's 'Invalid variants'): "
                  f"{', '.join(invalid)}", file=sys.stderr)
        print(f"harness: {len(bad)} of {done} trial(s) did not finish ok (see the report): "
              + "; ".join(f"{r['variant']} s{r['seed']} {r['status']} ({str(r.get('reason', '')).split('; ')[0][:160]})"
                          for r in bad[:5])
              + (" ..." if len(bad) > 5 else ""), file=sys.stderr)
        return 1
    return 0
