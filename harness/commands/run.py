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

from ..config import RunConfig
from ..errors import ConfigError, HarnessError, StoreError
from ..plugins import plugin_spec
from ..report import summary_table, to_markdown, trials_frame, write_report
from ..runner import ExecutionOptions, Plan, TrialSpec, check_plan_size, execute, make_specs
from ..store import RunStore, config_hash
from ..tasks.base import heldout_note
from ..train import environment, resolve_device
from .common import (add_config, add_selection, check_task, command_line, load_registry, resolve_config,
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
    p.add_argument("--seeds", type=int, metavar="N", help="seeds per variant: 0..N-1 (default 1)")
    p.add_argument("--seed-start", type=int, metavar="S", help="first seed (default 0)")
    p.add_argument("--results-dir", default="results", metavar="DIR", help="where runs are stored (default results)")
    p.add_argument("--run-id", default=None, help="name of the run folder (default: a timestamp)")
    p.add_argument("--quiet", "-q", action="store_true",
                   help="no progress bars or per-trial log lines (bars are off anyway when stderr is not a terminal)")
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
        try:
            from ..experiments import plan_from_experiment
        except ImportError as exc:
            raise HarnessError(f"--experiment {args.experiment}: experiment files are not supported by this "
                               f"installation (harness.experiments is missing); use --variants/--preset/--set") from exc
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

    return ray_session(options.address, list(plugins.get("modules") or []), log_function(quiet))


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


def main(args) -> int:
    given = given_options(args)
    if "experiment" in given:
        check_experiment_options(given)
    args.seeds_given = "seeds" in given
    fill_defaults(args)
    options = execution_options(args)
    if args.resume:
        return resume(args, given, options)
    reg = load_registry(args)
    plan = plan_from_args(args, reg)
    for _, point in plan.points:
        check_task(reg, point)
    if plan.measure is not None:
        return plan.measure(args, plan)
    variants, seeds, cfg = plan.variants, plan.seeds, plan.config
    device = device_name(args.device, options)
    options = options.resolved(len(variants) * len(seeds) * len(plan.points), device)
    plugins = plugin_spec(args).to_dict()
    specs = make_specs(variants, seeds, cfg, device, args.dtype, plugins, points=plan.points,
                       threads=options.trial_threads())
    meta = {
        "command": command_line(), "preset": plan.preset, "experiment": plan.name, "config": cfg.to_dict(),
        "points": {name: c.to_dict() for name, c in plan.points if name},
        "config_hash": config_hash(cfg.to_dict()), "variants": [v.name for v in variants], "seeds": seeds,
        "device": device, "dtype": args.dtype, "plugins": plugins,
        "environment": {**environment(device, trial_settings_applied=True), "threads": options.trial_threads()},
        "execution": options.to_dict(), "status": "running",
        "trials": [{"key": s.key, "spec": s.spec} for s in specs],
        "heldout": heldout_note(reg.task(cfg.train.task), cfg, seeds[0]),
        **plan.meta,
    }
    with executor_session(options, plugins, args.quiet):  # a Ray cluster that cannot be reached stores nothing
        store = RunStore.create(args.results_dir, meta, args.run_id)
        meta["run_id"] = store.root.name
        with store.lock():
            return execute_and_report(store, specs, meta, options, args.quiet,
                                      f"run {store.root}: {len(variants)} variant(s) x {len(seeds)} seed(s) x "
                                      f"{len(plan.points)} config(s) = {len(specs)} trial(s) on {device}, "
                                      f"{options.describe()}")


# ------------------------------------------------------------------------------------- resume

def _flat(d, prefix: str = "") -> dict:
    out = {}
    for k, v in (d or {}).items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _first_difference(stored: dict, requested: dict) -> str:
    a, b = _flat(stored), _flat(requested)
    for key in sorted(set(a) | set(b)):
        if a.get(key, "<unset>") != b.get(key, "<unset>"):
            return f"{key}: stored {a.get(key, '<unset>')!r}, requested {b.get(key, '<unset>')!r}"
    return "no field differs"


def _stored_specs(store: RunStore, meta: dict) -> list[TrialSpec]:
    trials = meta.get("trials")
    ok = (isinstance(trials, list) and isinstance(meta.get("config_hash"), str) and isinstance(meta.get("config"), dict)
          and all(isinstance(t, dict) and isinstance(t.get("key"), str) and isinstance(t.get("spec"), dict)
                  for t in trials))
    if not ok:
        raise StoreError(f"{str(store.root)!r} is not a resumable run: its config.json has no trial list and "
                         f"config hash (it was not written by 'python -m harness run')")
    return [TrialSpec(t["key"], t["spec"]) for t in trials]


def check_code_config(store: RunStore, meta: dict, specs: list[TrialSpec]) -> None:
    """Refuse a run whose stored configs this code reads differently (its config fields or
    defaults changed): the config hash this code computes must equal the stored one.

    Raises:
        StoreError: the hashes or a trial's config round trip differ.
    """
    where = str(store.root)
    try:
        code_hash = config_hash(RunConfig.from_dict(meta["config"]).to_dict())
    except HarnessError as exc:
        raise StoreError(f"cannot resume {where!r}: this version of the harness cannot read its config ({exc}); "
                         f"start a new run") from exc
    if code_hash != meta["config_hash"]:
        raise StoreError(f"cannot resume {where!r}: config hash mismatch (stored {meta['config_hash']}, this code "
                         f"computes {code_hash}; the harness's config changed since the run began); start a new run")
    for ts in specs:
        try:
            again = RunConfig.from_dict(ts.spec["config"]).to_dict()
        except (HarnessError, KeyError, TypeError) as exc:
            raise StoreError(f"cannot resume {where!r}: trial {ts.key} has a config this version of the harness "
                             f"cannot read ({exc}); start a new run") from exc
        if again != ts.spec["config"]:
            raise StoreError(f"cannot resume {where!r}: trial {ts.key}'s config reads differently with this code "
                             f"({_first_difference(ts.spec['config'], again)}); start a new run")


def check_requested(args, given: set[str], meta: dict, reg, specs: list[TrialSpec], where: str) -> None:
    """Refuse when options given with ``--resume`` ask for another config or other trials than
    the stored run. Options not given take the stored values.

    Raises:
        StoreError: naming the first difference.
    """
    if not given & (CONFIG_OPTIONS | TRIAL_OPTIONS | {"device", "dtype", "plugins"}):
        return
    refuse = f"cannot resume {where!r} with other options than it was started with"
    again = "leave the options out to resume as stored, or start a new run"
    if "plugins" in given:
        want = plugin_spec(args).to_dict()
        have = meta.get("plugins") or {}
        for k in ("modules", "files"):
            if list(want.get(k, [])) != list(have.get(k, [])):
                raise StoreError(f"{refuse}: plugin {k} stored {have.get(k, [])}, requested {want.get(k, [])} "
                                 f"(leave out -p/--plugin to use the stored ones)")
    for name in ("device", "dtype"):
        if name in given:
            want = device_name(args.device, ExecutionOptions()) if name == "device" else args.dtype
            if want != meta.get(name):
                raise StoreError(f"{refuse}: --{name} stored {meta.get(name)!r}, requested {want!r} "
                                 f"(leave out --{name} to use the stored one)")
    stored_by_key = {ts.key: ts.spec for ts in specs}
    ns = argparse.Namespace(**vars(args))
    experiment = args.experiment if "experiment" in given else (meta.get("experiment") or None)
    if experiment:
        check_experiment_options(given)
    if "preset" not in given:
        ns.preset = meta.get("preset") or "quick"
    if experiment:
        ns.experiment = experiment
        plan = plan_from_args(ns, reg)
        points, seeds, variants = plan.points, plan.seeds, [v.name for v in plan.variants]
    else:
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
    if given & CONFIG_OPTIONS:
        stored_points = {name: cfg for name, cfg in
                         ([("", meta["config"])] if not meta.get("points") else list(meta["points"].items()))}
        requested = {name: cfg.to_dict() for name, cfg in points}
        if set(stored_points) != set(requested):
            raise StoreError(f"{refuse}: sweep points stored {sorted(stored_points)}, requested {sorted(requested)} "
                             f"({again})")
        for name, cfg in requested.items():
            if config_hash(cfg) != config_hash(stored_points[name]):
                label = f" (point {name})" if name else ""
                raise StoreError(f"{refuse}: requested config{label} hash {config_hash(cfg)} != stored "
                                 f"{config_hash(stored_points[name])}; {_first_difference(stored_points[name], cfg)} "
                                 f"({again})")
    if given & TRIAL_OPTIONS:
        class _V:  # make_specs needs .name and .slots only for the keys
            def __init__(self, name):
                self.name, self.slots = name, {}

        keys = {ts.key for ts in make_specs([_V(n) for n in variants], seeds, points[0][1], "cpu", "fp32", {},
                                            points=points)}
        if keys != set(stored_by_key):
            extra, lost = sorted(keys - set(stored_by_key)), sorted(set(stored_by_key) - keys)
            raise StoreError(f"{refuse}: requested trials differ from the stored ones ("
                             f"{len(extra)} not in the run{': ' + ', '.join(extra[:3]) if extra else ''}; "
                             f"{len(lost)} left out{': ' + ', '.join(lost[:3]) if lost else ''}; {again})")


def check_components(reg, specs: list[TrialSpec], where: str) -> None:
    """Every stored trial's components must be registered (same plugins loaded)."""
    from ..registry import Variant

    for ts in specs:
        for slot, comp in Variant(ts.spec["variant"], dict(ts.spec.get("slots") or {})).resolved().items():
            try:
                reg.component(slot, comp)
            except HarnessError as exc:
                raise StoreError(f"cannot resume {where!r}: trial {ts.key} needs {exc} (load the plugins the "
                                 f"run was started with)") from exc


def resume(args, given: set[str], options: ExecutionOptions) -> int:
    """``run --resume RUN_DIR``: run the stored run's missing trials, then re-render its report."""
    from ..plugins import PluginSpec
    from ..registry import Registry

    if args.run_id:
        raise ConfigError("--run-id cannot be combined with --resume (a resumed run keeps its folder)")
    store = RunStore.open(args.resume)
    meta = store.meta()
    specs = _stored_specs(store, meta)
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
                                  f"{options.describe()}", total=len(specs))


# ----------------------------------------------------------------------------- execute + report

class Terminated(KeyboardInterrupt):
    """SIGTERM, turned into an interrupt so the run stops as cleanly as on Ctrl-C."""


def _on_sigterm(signum, frame):
    raise Terminated()


def execute_and_report(store: RunStore, specs: list[TrialSpec], meta: dict, options: ExecutionOptions,
                       quiet: bool, headline: str, total: int | None = None) -> int:
    """Execute ``specs`` into ``store``, re-render the report and return the exit code."""
    total = len(specs) if total is None else total
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
    report = write_report(store)
    done = len(store.done_keys() & {t["key"] for t in meta["trials"]})
    if interrupted is not None:
        what = "terminated (SIGTERM)" if isinstance(interrupted, Terminated) else "interrupted"
        print(f"harness: {what}; {done} of {total} trial(s) are stored in {store.root}; "
              f"resume with: python -m harness run --resume {store.root}", file=sys.stderr)
        return 130
    if not specs and log:
        log(f"nothing to run: all {total} trial(s) of {store.root} are stored")
    print(to_markdown(summary_table(trials_frame(store))))
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
