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

from .beside import idle_beside, preload_report_modules, pretraining_check, warm_workers
from .env import environment
from .executors.limits import TIMED_OUT, Limits, out_of_time, stopped
from .experiments import run_table
from .experiments import write_run_report as write_report  # a run's report with its experiment's sections
from .overview import check_configs, record_check
from .plugins import PluginSpec
from .planning import RunPlan, check_tracking, plan_new_run, plan_resume, resolved_for
from .provenance import current_code, write_sources
from .request import RunOutcome, RunRequest, Terminated
from .resume import record_code
from .runner import execute, plan_baseline
from .runmeta import Execution, Resume, RunMeta
from .saved import with_save_model
from .store import RunStore, config_hash
from .tasks.splits import heldout_note
from .tboard import run_logdir, trial_writer
from .track import default_mlflow_uri
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


def executor_session(options: Execution, plugins: dict, quiet: bool):
    """For Ray: connect to (or start) the cluster before anything is stored, so an unreachable
    cluster is one line and exit 2 with no run folder left behind."""
    if options.executor != "ray":
        return contextlib.nullcontext()
    from .executors.ray_cluster import ray_session

    modules = PluginSpec.from_dict(plugins).module_names()  # the -p modules to ship, not -p no:NAME
    return ray_session(options.address, modules, log_function(quiet))


def start_run(req: RunRequest) -> RunOutcome:
    """Plan (:func:`harness.planning.plan_new_run`), store and execute a new run (or resume one: ``req.resume``,
    :func:`resume_run`), then write its report.

    Returns:
        RunOutcome: the store, metadata, report and interrupt (if any).

    Raises:
        HarnessError: bad input, before anything is stored (exit 2 on the command line).
    """
    if req.resume is not None:
        return resume_run(req)
    rp = plan_new_run(req)
    reg, plan, specs, options, device = rp.registry, rp.plan, rp.specs, rp.options, rp.device
    meta, code = run_meta(rp), current_code(req.plugins)
    meta.code = code.record
    meta.baseline = plan_baseline(req, reg, plan)
    with executor_session(options, rp.plugins, req.quiet):  # a Ray cluster that cannot be reached stores nothing
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


def run_meta(rp: RunPlan) -> RunMeta:
    """The new run's ``config.json`` before any trial ran, as the record the run updates and the
    store writes."""
    req, reg, plan, specs, options = rp.request, rp.registry, rp.plan, rp.specs, rp.options
    cfg, seeds, device = plan.config, plan.seeds, rp.device
    return RunMeta(
        kind=plan.kind, command=req.command_line(), preset=plan.preset, config=cfg.to_dict(),
        variants=[v.name for v in plan.variants], seeds=seeds, device=device, dtype=rp.dtype, plugins=rp.plugins,
        environment={**environment(device, trial_settings_applied=True), "threads": options.trial_threads()},
        experiment=plan.name, points={name: c.to_dict() for name, c in plan.points if name},
        config_hash=config_hash(cfg.to_dict()), execution=options, status="running",
        trials=list(specs),
        heldout=heldout_note(reg.task(cfg.train.task).for_config(cfg), cfg, seeds[0]), **plan.meta)


# ------------------------------------------------------------------------------------- resuming

def resume_run(req: RunRequest) -> RunOutcome:
    """Run the stored run's missing trials (``req.resume``; with ``req.retry_failed`` also its failed
    and diverged ones, whose old files are kept under ``trials/retried/``), then re-render its report.
    Options the request gives must agree with the stored run (:func:`harness.planning.plan_resume`).

    Raises:
        StoreError: no resumable run there, or the request asks for something else than it holds.
    """
    rp = plan_resume(req)
    store, meta, specs = rp.store, rp.meta, rp.specs
    retried = retire_failed(store, specs) if req.retry_failed else []
    todo = [ts for ts in specs if ts.key in set(store.missing(ts.key for ts in specs))]
    todo = with_save_model(todo) if req.save_models else todo
    options = resolved_for(rp.options, todo, meta.device or "cpu")
    check_tracking(req, options)
    with executor_session(options, meta.plugins or {}, req.quiet), store.lock():
        entry = Resume(req.command_line(), len(todo), retried, options)
        record_code(store, entry, rp.code, rp.changes, {t.key for t in specs} - {t.key for t in todo},
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


# ----------------------------------------------------------------------------- execute + report

def events_writer(req: RunRequest, store: RunStore, meta: RunMeta):
    """``run --tensorboard``: the callback that writes each stored trial's events (those not written
    live: :func:`harness.tboard.trial_writer`), or None."""
    return None if req.tensorboard is None else trial_writer(run_logdir(req.tensorboard, store.root), meta)


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
