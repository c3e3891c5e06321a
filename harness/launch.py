"""Start or resume a run from a :class:`harness.request.RunRequest`: plan, store, check, execute,
report. The one path that ``python -m harness run``, :func:`harness.run` and the suite take.

:func:`start_run` and :func:`resume_run` return a :class:`RunOutcome`; they print nothing but the
progress lines (stderr, unless ``request.quiet``). The command line prints the outcome
(``harness.commands.run``); the Python API returns the run folder.

Interrupts: from the moment the run folder exists, Ctrl-C or SIGTERM at any phase (check,
training, report) stops the run cleanly: ``config.json`` says ``interrupted``, every finished
trial is kept, and the outcome carries the interrupt (the command line prints how to resume
and exits 130).
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time

from typing import Any

from .config import DEFAULT_PRESET, get_preset, resolve_key
from .schedule import peak_lr
from .settings import parse_overrides
from .errors import ConfigError
from .experiments import plan_from_experiment, spec_from_meta
from .experiments import run_table
from .beside import idle_beside, preload_report_modules, pretraining_check, warm_workers
from .experiments import write_run_report as write_report  # a run's report with its experiment's sections
from .limits import TIMED_OUT, Limits, out_of_time, stopped
from .plugins import PluginSpec
from .registry import Registry
from .request import CONFIG_OPTIONS, TRIAL_OPTIONS, RunOutcome, RunRequest, Terminated
from .overview import check_configs, record_check
from .provenance import current_code, write_sources
from .resume import (check_code, check_code_config, check_components, check_plugins, check_points, check_setting,
                     check_trials, keep_baseline, record_code, stored_specs)
from .runner import Plan, execute, lr_grid_points, make_specs, plan_baseline, with_threads
from .runmeta import MAX_GROUP, Execution, Resume, RunMeta
from .store import RunStore, config_hash
from .tasks.splits import heldout_note
from .env import environment, resolve_device
from .saved import with_save_model
from .tboard import check_available, run_logdir, trial_writer
from .track import check_mlflow, default_mlflow_uri
from .trial import TrialSpec

#: Trial statuses that ``--retry-failed`` runs again (an invalid variant fails the same way again).
RETRY_STATUSES = ("failed", "diverged", TIMED_OUT)


def _on_sigterm(signum, frame):
    raise Terminated()


@contextlib.contextmanager
def sigterm_as_interrupt():
    """While active (main thread only), SIGTERM raises :class:`Terminated`."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def log_function(quiet: bool):
    """Where log lines go: stderr, flushed at once (None when quiet)."""
    return None if quiet else (lambda line: print(line, file=sys.stderr, flush=True))


#: A run's log lines (its headline, one line per stored trial, every fallback's reason) are kept in
#: this file of the run's folder, appended to on resume, with or without ``--quiet``.
RUN_LOG = "log.txt"


def run_log(root, quiet: bool):
    """The log function of a run stored in ``root``: each line is appended to ``root/log.txt``
    (:data:`RUN_LOG`) and, unless ``quiet``, printed on stderr (:func:`log_function`)."""
    echo = log_function(quiet)
    path = root / RUN_LOG

    def log(line: str) -> None:
        try:
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(line.rstrip("\n") + "\n")
        except OSError as exc:
            if exc.errno and not exc.filename:  # a full disk: name the file (a failed write or close names none)
                raise type(exc)(exc.errno, exc.strerror, str(path)) from exc
            raise
        if echo is not None:
            echo(line)
    return log


def load_registry(plugins: PluginSpec) -> Registry:
    """The registry with ``plugins`` loaded; its warnings as ``harness: warning:`` lines on stderr."""
    reg = Registry.from_plugins(plugins)
    for w in reg.warnings:
        print(f"harness: warning: {w}", file=sys.stderr)
    return reg


# ------------------------------------------------------------------------------------- planning

def resolve_config(preset: str, overrides, registry: Registry | None = None) -> Any:
    """Preset + ``--set`` items, validated; with ``registry``, then fitted to the task
    (:meth:`harness.Task.fit`: e.g. ``g2p`` raises ``model.vocab`` and ``model.max_len`` that the
    items do not set). Raises UnknownNameError / ConfigError."""
    cfg = get_preset(preset)
    values = parse_overrides(list(overrides))
    cfg = cfg.override(values) if values else cfg.validate()
    if registry is None:
        return cfg
    given = {".".join(resolve_key(k)) for k in values}
    return registry.task(cfg.train.task).for_config(cfg).fit(cfg, given)


def check_experiment_options(given: set[str]) -> None:
    """With an experiment the file decides the variants and the preset: ``variants``, ``grid``
    and ``preset`` are refused rather than ignored, and ``seed_start`` needs ``seeds``.

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
    if "lr_grid" in given:
        raise ConfigError("--lr-grid cannot be combined with --experiment: sweep the learning rate in the file "
                          "([sweep] \"train.lr\" = [...]); its report then chooses each variant's learning rate")


def plan_run(req: RunRequest, reg: Registry) -> Plan:
    """The run's plan from its experiment, or from its variants/grid, preset/overrides and seeds.

    Raises:
        HarnessError: unknown variant/preset/task, bad override, too many trials.
    """
    if req.experiment:
        return plan_from_experiment(req.experiment, reg, req)
    preset = req.preset or DEFAULT_PRESET
    cfg = resolve_config(preset, req.overrides, reg)
    variants = reg.grid() if req.grid else reg.select(req.patterns())
    if req.lr_grid is None:
        return Plan(variants, req.seed_list(len(variants)), [("", cfg)], preset=preset)
    points = lr_grid_points(cfg, req.lr_grid)
    seeds = req.seed_list(len(variants) * len(points))
    return Plan(variants, seeds, points, preset=preset, base=cfg,
                meta={"lr_grid": {"default": peak_lr(cfg.train, cfg.model.d_model),
                                  "values": [float(v) for v in req.lr_grid]}})


def device_name(name: str, options: Execution) -> str:
    """The device the trials use. On Ray an explicit ``cuda`` is checked on the workers, not here
    (the driver may have no GPU); everything else must be available on this machine."""
    if options.executor == "ray" and name.startswith("cuda"):
        return "cuda"
    return resolve_device(name).type


def executor_session(options: Execution, plugins: dict, quiet: bool):
    """For Ray: connect to (or start) the cluster before anything is stored, so an unreachable
    cluster is one line and exit 2 with no run folder left behind."""
    if options.executor != "ray":
        return contextlib.nullcontext()
    from .executors import ray_session

    modules = PluginSpec.from_dict(plugins).module_names()  # the -p modules to ship, not -p no:NAME
    return ray_session(options.address, modules, log_function(quiet))


def execution_options(req: RunRequest) -> Execution:
    """The request's execution options validated; Ray imported early when asked for, so a missing
    Ray is reported before anything is stored."""
    opts = req.execution()
    if opts.executor == "ray":
        from .executors import import_ray

        import_ray()
    return opts


# ------------------------------------------------------------------------------------- starting

def check_switches() -> None:
    """The environment switches a run's trials read (``HARNESS_PREFIX_PASS``,
    ``harness.tasks.prefix``; ``HARNESS_CAPTURE``, :func:`harness.vprobe.capture_env`), checked
    before anything is stored: a bad value is bad input, not a failed trial.

    Raises:
        ConfigError: a value the switch does not take (the message names the variable and its values).
    """
    from .env import prefix_pass
    from .vprobe import capture_env

    try:
        prefix_pass()
    except ValueError as exc:
        raise ConfigError(f"{exc} (or unset it)") from None
    capture_env()


def start_run(req: RunRequest) -> RunOutcome:
    """Plan, store and execute a new run (or resume one: ``req.resume``), then write its report.

    Returns:
        RunOutcome: the store, metadata, report and interrupt (if any).

    Raises:
        HarnessError: bad input, before anything is stored (exit 2 on the command line).
    """
    req.validate()
    check_switches()
    if req.resume is not None:
        return resume_run(req)
    given = req.given()
    if "experiment" in given:
        check_experiment_options(given)
    options = execution_options(req)
    reg = load_registry(req.plugins)
    plan = plan_run(req, reg)
    for _, point in plan.points:
        reg.task(point.train.task).for_config(point).validate(point)
    device, dtype = device_name(req.device or "auto", options), req.dtype or "fp32"
    plugins = req.plugins.to_dict()
    specs = make_specs(plan.variants, plan.seeds, plan.config, device, dtype, plugins, points=plan.points,
                       measure=plan.measure)
    options = resolved_for(options, specs, device)
    specs = with_threads(specs, options.trial_threads())
    specs = with_save_model(specs) if req.save_models else specs
    check_tracking(req, options)  # before anything is stored
    meta, code = run_meta(req, reg, plan, specs, device, dtype, options, plugins), current_code(req.plugins)
    meta.code = code.record
    meta.baseline = plan_baseline(req, reg, plan)
    with executor_session(options, plugins, req.quiet):  # a Ray cluster that cannot be reached stores nothing
        store = RunStore.create(req.results_dir, meta, req.run_id)  # sets meta.run_id
        write_sources(store.root, code)
        headline = (f"run {store.root}: {len(plan.variants)} variant(s) x {len(plan.seeds)} seed(s) x "
                    f"{len(plan.points)} config(s) = {len(specs)} trial(s) on {device}, {options.describe()}")
        # a measurement has no use for the equivalence classes (its report does not show them)
        check = req.check and plan.measure is None and len([v for v in plan.variants if not v.buggy]) > 1

        def check_now() -> dict:  # after bad input is refused, inside the interrupt guard
            return record_check(reg, plan.variants, run_log(store.root, req.quiet), check_configs(reg, plan))

        def keep(result: dict) -> None:  # in this (the main) thread: the only writer of config.json
            meta.check = result
            store.write_meta(meta)

        with store.lock():
            return drive(store, specs, meta, options, req.quiet, headline, before=(check_now, keep) if check else None,
                         after_store=events_writer(req, store, meta), track=tracking(req, store),
                         keep_checkpoints=req.keep_checkpoints)


def run_meta(req: RunRequest, reg, plan: Plan, specs: list[TrialSpec], device: str, dtype: str,
             options: Execution, plugins: dict) -> RunMeta:
    """The new run's ``config.json`` before any trial ran, as the record the run updates and the
    store writes."""
    cfg, seeds = plan.config, plan.seeds
    return RunMeta(
        kind=plan.kind, command=req.command_line(), preset=plan.preset, config=cfg.to_dict(),
        variants=[v.name for v in plan.variants], seeds=seeds, device=device, dtype=dtype, plugins=plugins,
        environment={**environment(device, trial_settings_applied=True), "threads": options.trial_threads()},
        experiment=plan.name, points={name: c.to_dict() for name, c in plan.points if name},
        config_hash=config_hash(cfg.to_dict()), execution=options, status="running",
        trials=list(specs),
        heldout=heldout_note(reg.task(cfg.train.task).for_config(cfg), cfg, seeds[0]), **plan.meta)


# ------------------------------------------------------------------------------------- resuming

def resolved_for(options: Execution, specs: list[TrialSpec], device: str) -> Execution:
    """``options`` resolved (:meth:`Execution.resolved`) for running ``specs`` on ``device``: the trials
    and the trial groups they would form (:func:`harness.group.group_specs`)."""
    from .group import group_specs

    return options.resolved(len(specs), device, len(group_specs(specs, MAX_GROUP)))


def resume_run(req: RunRequest) -> RunOutcome:
    """Run the stored run's missing trials (``req.resume``; with ``req.retry_failed`` also its failed
    and diverged ones, whose old files are kept under ``trials/retried/``), then re-render its report.
    Options the request gives must agree with the stored run (:mod:`harness.resume`).

    Raises:
        StoreError: no resumable run there, or the request asks for something else than it holds.
    """
    req.validate()
    given = req.given()
    options = execution_options(req)
    store = RunStore.open(req.resume)
    meta = store.meta()
    specs = stored_specs(store, meta)
    where = str(store.root)
    check_code_config(store, meta, specs)
    reg = load_registry(PluginSpec.from_dict(meta.plugins))
    check_components(reg, specs, where)
    code = current_code(PluginSpec.from_dict(meta.plugins))
    changes = check_code(meta, code.record, where, req.allow_code_change)
    check_requested(req, given, meta, reg, specs, where)
    keep_baseline(req.baseline, meta, where)
    execution_given = given & {"executor", "jobs", "threads", "address", "vectorize_seeds", "capture"}
    if not execution_given and meta.execution is not None:
        stored = meta.execution
        options = Execution(stored.executor, stored.jobs, stored.threads, stored.address,
                            stored.vectorize_seeds, stored.capture, req.trial_timeout, req.time_budget).validate()
    retried = retire_failed(store, specs) if req.retry_failed else []
    todo = [ts for ts in specs if ts.key in set(store.missing(ts.key for ts in specs))]
    todo = with_save_model(todo) if req.save_models else todo
    options = resolved_for(options, todo, meta.device or "cpu")
    check_tracking(req, options)
    with executor_session(options, meta.plugins or {}, req.quiet), store.lock():
        entry = Resume(req.command_line(), len(todo), retried, options)
        record_code(store, entry, code, changes, {t.key for t in specs} - {t.key for t in todo},
                    run_log(store.root, req.quiet))
        meta.resumes = [*(meta.resumes or []), entry]
        if entry.code is not None:  # stored before a trial of the new code is: a kill keeps the record
            store.write_meta(meta)
        headline = (f"resume {store.root}: {len(specs) - len(todo)} of {len(specs)} trial(s) stored, running the "
                    f"{len(todo)} missing" + (f" ({len(retried)} failed, retried)" if retried else "")
                    + f" on {meta.device or 'cpu'}, {options.describe()}")
        return drive(store, todo, meta, options, req.quiet, headline, total=len(specs),
                     after_store=events_writer(req, store, meta), track=tracking(req, store),
                     keep_checkpoints=req.keep_checkpoints)


def retire_failed(store: RunStore, specs: list[TrialSpec]) -> list[str]:
    """Move the stored trials of ``specs`` whose status is in :data:`RETRY_STATUSES` to
    ``trials/retried/`` (kept for the record), so they count as missing. Returns their keys."""
    keys = {ts.key for ts in specs}
    out = []
    for t in store.load_trials():
        if t.key in keys and t.status in RETRY_STATUSES:
            store.retire(t.key)
            out.append(t.key)
    return out


def check_requested(req: RunRequest, given: set[str], meta: RunMeta, reg, specs: list[TrialSpec],
                    where: str) -> None:
    """Refuse when options given with ``resume`` ask for other plugins, device, dtype, config or
    trials than the stored run. Options not given take the stored values.

    Raises:
        StoreError: naming the first difference.
    """
    if not given & (CONFIG_OPTIONS | TRIAL_OPTIONS | {"device", "dtype", "plugins"}):
        return
    if "plugins" in given:
        check_plugins(req.plugins.to_dict(), meta, where)
    if "device" in given:
        check_setting("device", device_name(req.device, Execution()), meta, where)
    if "dtype" in given:
        check_setting("dtype", req.dtype, meta, where)
    variants, seeds, points = requested_plan(req, given, meta, reg)
    if given & CONFIG_OPTIONS:
        check_points(points, meta, where)
    if given & TRIAL_OPTIONS:
        check_trials(variants, seeds, points, specs, where)


def requested_plan(req: RunRequest, given: set[str], meta: RunMeta, reg) -> tuple[list[str], list[int], list]:
    """``(variant names, seeds, [(point name, RunConfig)])`` that the options given with ``resume``
    ask for; what was not given is taken from the stored run (``meta``).

    Raises:
        HarnessError: the given options themselves are bad (unknown variant, bad override, ...).
    """
    experiment = req.experiment if "experiment" in given else (meta.experiment or None)
    if experiment:
        check_experiment_options(given)
        stored = None if "experiment" in given else spec_from_meta(meta)  # the run's own record, not the name
        plan = plan_from_experiment(experiment, reg, req, exp=stored)
        return [v.name for v in plan.variants], plan.seeds, plan.points
    preset = req.preset if "preset" in given else (meta.preset or DEFAULT_PRESET)
    points = [("", resolve_config(preset, req.overrides, reg))]
    grid = req.lr_grid if "lr_grid" in given else (meta.lr_grid or {}).get("values")
    if grid:
        points = lr_grid_points(points[0][1], grid)
    if given & {"variants", "grid"}:
        variants = [v.name for v in (reg.grid() if req.grid else reg.select(req.patterns()))]
    else:
        variants = list(meta.variants)
    if given & {"seeds", "seed_start"}:
        seeds = req.seed_list(len(variants))
    else:
        seeds = list(meta.seeds or [])
    return variants, seeds, points


# ----------------------------------------------------------------------------- execute + report

def events_writer(req: RunRequest, store: RunStore, meta: RunMeta):
    """``run --tensorboard``: the callback that writes each stored trial's events (those not written
    live: :func:`harness.tboard.trial_writer`), or None."""
    return None if req.tensorboard is None else trial_writer(run_logdir(req.tensorboard, store.root), meta)


def check_tracking(req: RunRequest, options: Execution) -> None:
    """``--tensorboard`` / ``--mlflow`` refused before anything is stored.

    Raises:
        ConfigError: its package is not installed; ``--mlflow`` with ``--executor ray``.
    """
    if req.tensorboard is not None:
        check_available()
    if req.mlflow is not None:
        if options.executor == "ray":
            raise ConfigError("--mlflow logs from the processes that train the trials, which --executor ray "
                              "places on other machines: use the local executor (--jobs N) with --mlflow")
        check_mlflow()


def tracking(req: RunRequest, store: RunStore) -> dict | None:
    """What the trials track live as they train (``TrialSpec.track``, :mod:`harness.track`): the
    absolute TensorBoard folder of ``--tensorboard``, the MLflow URI of ``--mlflow`` (default: a file
    store in the run folder), the run id; None when neither is asked for."""
    if req.tensorboard is None and req.mlflow is None:
        return None
    board = None if req.tensorboard is None else str(run_logdir(req.tensorboard, store.root).resolve())
    uri = None if req.mlflow is None else (req.mlflow or default_mlflow_uri(store.root))
    return {"tensorboard": board, "mlflow": uri, "run": store.root.name}


def drive(store: RunStore, specs: list[TrialSpec], meta: RunMeta, options: Execution, quiet: bool,
          headline: str, total: int | None = None, before=None, after_store=None, track=None,
          keep_checkpoints: bool = False) -> RunOutcome:
    """Run the pre-training check ``before`` (``(check_now, keep)``: before the trials, or beside them where
    other processes train them and leave this one idle, :func:`harness.beside.pretraining_check`), execute ``specs`` into
    ``store`` and write the report, with Ctrl-C and SIGTERM at any of these phases ending the run as
    ``interrupted``; ``after_store(key, result)`` runs after each trial is stored (``--tensorboard``);
    ``track``: what the trials track live (:func:`tracking`); ``keep_checkpoints``: leave each stored trial's
    checkpoint in place (:func:`harness.runner.execute`).
    A ``--time-budget`` counts from here; spent before every trial started, the run ends ``out_of_time``.

    Raises:
        ResourceError: a file of the run could not be written (a full disk, permissions): the trials
            stored before stay, the run's status is ``stopped`` (where it can still be written).
    """
    total = len(specs) if total is None else total
    log = run_log(store.root, quiet)
    interrupted: KeyboardInterrupt | None = None
    report, ran = None, None
    limits = Limits.start(options.trial_timeout, options.time_budget) if options.limited() else None
    t0 = time.perf_counter()
    with sigterm_as_interrupt():
        try:
            if log:
                log(headline)
            warm_workers(options, len(specs))
            beside = idle_beside(options, specs)
            wait_check = pretraining_check(*before, beside) if before is not None else (lambda: None)
            if specs:
                preload_report_modules(beside)
                ran = execute(specs, store, options, quiet=quiet, log=log, after_store=after_store, track=track,
                              limits=limits, keep_checkpoints=keep_checkpoints)
            wait_check()
        except KeyboardInterrupt as exc:
            interrupted = exc
        except OSError as exc:  # a full disk, a folder made read-only: what is stored stays stored
            raise stopped(exc, store, meta, t0) from None
        meta.run_wall_s = float(meta.run_wall_s or 0.0) + time.perf_counter() - t0
        meta.status = "interrupted" if interrupted is not None else "complete"  # read by harness verify
        if interrupted is None and ran is not None and len(ran) < len(specs):
            out_of_time(meta, limits, len(specs) - len(ran), store, log)
        try:
            store.write_meta(meta)
            report = write_report(store)
        except KeyboardInterrupt as exc:
            interrupted = interrupted or exc
            meta.status = "interrupted"
            store.write_meta(meta)
        except OSError as exc:
            raise stopped(exc, store, meta, None) from None
    if not specs and interrupted is None and log:
        log(f"nothing to run: all {total} trial(s) of {store.root} are stored")
    table = run_table(store) if report is not None else None  # a measurement's slope table
    return RunOutcome(store, meta, report, interrupted, total, table=table)
