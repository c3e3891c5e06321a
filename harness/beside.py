"""What a run's own process does beside the worker processes that train its trials.

Where other processes train the trials (a local worker pool, or Ray: :func:`trains_elsewhere`), the run's
process mostly waits. It starts the workers' fork server before the pre-training check
(:func:`warm_workers`) and, where that takes no core from the trials (:func:`idle_beside`: on CUDA, or a
pool that leaves cores free), runs the check beside the trials (:func:`pretraining_check`) and imports the
report's modules while they train (:func:`preload_report_modules`), instead of before and after them.
"""
from __future__ import annotations

import contextlib
import threading

from .env import available_cores
from .runmeta import Execution
from .trial import TrialSpec


def warm_workers(options: Execution, n_specs: int) -> bool:
    """Start the fork server now when this run's trials will go to local worker processes
    (:func:`harness.executors.pool.run_process_pool`) and it is not running yet (the command line starts
    it before importing torch: :mod:`harness.workers`): it imports :data:`~harness.workers.FORKSERVER_PRELOAD`
    (torch and the harness: about a second) in a process of its own while this one
    runs the pre-training check, instead of after it. Returns whether one runs."""
    from .workers import start_fork_server

    if options.executor != "local" or not trains_elsewhere(options, n_specs):
        return False
    return start_fork_server()  # returns at once; the server imports in the background


def trains_elsewhere(options: Execution, n_specs: int) -> bool:
    """Whether other processes train these ``n_specs`` trials, leaving this one waiting: a local worker pool
    (``--jobs`` >= 2 and two trials or more, :func:`harness.runner.execute`) or Ray."""
    if options.executor != "local":
        return n_specs > 0
    return isinstance(options.jobs, int) and options.jobs >= 2 and n_specs >= 2


def idle_beside(options: Execution, specs: list[TrialSpec]) -> bool:
    """Whether this process can work beside its trials without taking a core from them: other processes train
    them (:func:`trains_elsewhere`), and either on CUDA (the workers mostly wait on the GPU) or in a local
    pool that leaves cores free (``jobs x threads`` below :func:`harness.env.available_cores`). On a CPU whose
    cores the workers fill, work beside them would slow the first trials and bias their timing columns."""
    if not trains_elsewhere(options, len(specs)):
        return False
    if any(str(ts.device).startswith("cuda") for ts in specs):
        return True
    threads = options.trial_threads() or 1
    return options.executor == "local" and options.jobs * threads < available_cores()


def preload_report_modules(beside: bool) -> threading.Thread | None:
    """With ``beside`` (:func:`idle_beside`), import what the report needs (``scipy.stats``,
    ``matplotlib.pyplot``: over a second together) in a daemon thread while other processes train, so that
    the report after the last trial does not start with it; returns the thread (None: nothing started).
    An import that fails is left for the report to raise."""
    if not beside:
        return None

    def load() -> None:
        with contextlib.suppress(Exception):
            import importlib

            from .report.plots import pyplot

            importlib.import_module("scipy.stats")  # the report's statistics (harness.stats)
            pyplot()

    thread = threading.Thread(target=load, name="harness-report-imports", daemon=True)
    thread.start()
    return thread


def pretraining_check(check_now, keep, beside: bool):
    """The pre-training check, which only records check's classes for the report: ``keep(check_now())`` now,
    or, with ``beside`` (:func:`idle_beside`), ``check_now()`` in a daemon thread while the trials train and
    ``keep`` of its result in the caller's thread when it calls the returned ``wait()``. The thread writes
    nothing: a run interrupted before ``wait()`` leaves it behind and records no check, and an unexpected
    error of the check becomes its record's ``error`` (as :func:`harness.overview.check_classes` records
    the expected ones) instead of ending the run after its trials."""
    if not beside:
        keep(check_now())
        return lambda: None
    got: list[dict] = []

    def target() -> None:
        try:
            got.append(check_now())
        except Exception as exc:  # noqa: BLE001 - recorded, as check_classes records its own errors
            reason = (str(exc).strip().splitlines() or [""])[0]
            got.append({"classes": [], "failures": [], "error": f"{type(exc).__name__}: {reason}", "wall_s": 0.0})

    thread = threading.Thread(target=target, name="harness-check", daemon=True)
    thread.start()

    def wait() -> None:
        thread.join()
        if got:
            keep(got[0])
    return wait
