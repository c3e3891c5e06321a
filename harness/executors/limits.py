"""Time limits of trials: ``run --trial-timeout SECONDS`` and ``run --time-budget SECONDS``.

A trial that hangs in the run's own process cannot be stopped, so with a limit every unit of work
(a trial, or with ``--vectorise-seeds on`` a vectorised trial group) runs in a worker process of
its own, started from the fork server (:data:`harness.workers.START_METHOD`), at most ``jobs`` at a
time. Each worker sends its progress and, at the end, its results (``TrialResult.to_dict()``) through
a one-way pipe of its own (``multiprocessing.Pipe``), so ending one worker never corrupts another's
channel, as it can a shared queue.

* ``--trial-timeout T``: a unit still running ``T`` seconds after its worker started is ended
  (SIGKILL) and each of its trials is stored with status :data:`TIMED_OUT` and a reason naming the
  limit and the last step its worker reported. The run goes on with the other trials.
* ``--time-budget B``: counted from the start of the run (or resume) that gives it. Once spent, no
  further unit starts (those trials stay missing: the run is stored with status
  :data:`OUT_OF_TIME`, a partial run that ``--resume`` finishes) and running units are ended as
  :data:`TIMED_OUT`.

``run --resume RUN --retry-failed`` runs timed-out trials again (``harness.launch.RETRY_STATUSES``);
the limits are those of the invocation that gives them (a resume does not inherit them, so a
retried trial is not held to the limit it exceeded unless it is given again).

A worker that dies without a result (a signal, the out-of-memory killer) leaves its trials
``failed`` with the reason; Ctrl-C or SIGTERM ends every worker and is passed on.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait as wait_ready
from typing import Any, Callable

from ..errors import ResourceError, failure_reason, resource_text
from ..progress import TrialBars
from ..trial import TrialResult, TrialSpec
from ..workers import FORKSERVER_PRELOAD, START_METHOD
from .pool import init_worker, main_module_hidden, sigint_ignored
from .units import OnDone, WorkUnit, plan_units, run_unit

#: Status of a trial ended by ``--trial-timeout`` or ``--time-budget`` (retried by ``--retry-failed``).
TIMED_OUT = "timed_out"
#: ``config.json`` status of a run whose ``--time-budget`` was spent before every trial could start.
OUT_OF_TIME = "out_of_time"
#: Seconds between the scheduler's looks at its workers when nothing arrives.
POLL_S = 0.25


@dataclass
class Limits:
    """The limits one invocation runs under: ``trial_timeout`` seconds per unit, and ``deadline``,
    the ``time.monotonic()`` at which the ``budget`` (seconds) is spent; None: no such limit."""

    trial_timeout: float | None = None
    budget: float | None = None
    deadline: float | None = None

    @classmethod
    def start(cls, trial_timeout: float | None, budget: float | None) -> "Limits":
        """Limits whose budget starts now."""
        return cls(trial_timeout, budget, None if budget is None else time.monotonic() + budget)

    def spent(self, now: float | None = None) -> bool:
        """Whether the budget is spent (False without one)."""
        return self.deadline is not None and (time.monotonic() if now is None else now) >= self.deadline


@dataclass
class _Worker:
    """One running unit: its process, the parent's end of its pipe, when it started, the last step
    each of its trials reported (key -> step)."""

    unit: WorkUnit
    proc: Any
    conn: Any
    started: float
    steps: dict[str, int] = field(default_factory=dict)
    out: Any = None  # the worker's payload once it arrived


def _unit_worker(conn, specs: list[dict], threads: int, capture: str | None, run_pid: int) -> None:
    """A worker process's body: :func:`~harness.executors.units.run_unit` on the unit's payload, progress and the
    result sent through ``conn``."""
    init_worker(threads, None, run_pid)

    def progress_for(key: str):
        def progress(step: int, loss: float) -> None:  # every step: a timed-out trial's reason names its last
            conn.send(("step", key, int(step), float(loss)))
        return progress

    try:
        conn.send(("done", run_unit(specs, [progress_for(TrialSpec.from_dict(d).key) for d in specs], capture)))
    except BaseException as exc:  # noqa: BLE001 - the parent records it as the unit's failure
        conn.send(("error", failure_reason(exc)))
    finally:
        conn.close()


def timed_out(ts: TrialSpec, reason: str, wall_s: float) -> TrialResult:
    """The stored result of a trial whose worker was ended: status :data:`TIMED_OUT`, ``reason``,
    ``wall_s`` (seconds from its worker's start to its end)."""
    result = TrialResult.failed(ts, reason)
    result.row.update({"status": TIMED_OUT, "wall_s": float(wall_s)})
    return result


class _Scheduler:
    """Starts units in worker processes, at most ``jobs`` at a time, and ends those past a limit."""

    def __init__(self, units: list[WorkUnit], jobs, threads, on_done: OnDone, bars: TrialBars, limits: Limits, log):
        self.pending, self.jobs, self.threads = deque(units), jobs, threads
        self.on_done, self.bars, self.limits, self.log = on_done, bars, limits, log
        self.ctx = multiprocessing.get_context(START_METHOD)
        if START_METHOD == "forkserver":
            self.ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
        self.running: list[_Worker] = []

    def start(self, unit: WorkUnit) -> None:
        recv, send = self.ctx.Pipe(duplex=False)
        proc = self.ctx.Process(target=_unit_worker, name=f"harness-trial-{unit.key}",
                                args=(send, unit.payload()[0], self.threads, unit.capture, os.getpid()))
        with sigint_ignored(), main_module_hidden():
            proc.start()
        send.close()  # the worker holds the only writing end: its exit is an EOF here
        self.running.append(_Worker(unit, proc, recv, time.monotonic()))

    def run(self) -> list[TrialSpec]:
        """Run every unit; returns the trials left unstarted because the budget was spent."""
        try:
            while self.pending or self.running:
                while self.pending and len(self.running) < self.jobs and not self.limits.spent():
                    self.start(self.pending.popleft())
                if not self.running:
                    break  # the budget is spent: what is pending stays unstarted
                wait_ready([w.conn for w in self.running], timeout=self._next_wait())
                for w in list(self.running):
                    self._read(w)
                self._enforce()
        except BaseException:
            for w in self.running:
                self._end(w)
            raise
        finally:
            self.bars.close_all()
        return [ts for unit in self.pending for ts in unit.specs]

    def _next_wait(self) -> float:
        now, due = time.monotonic(), [POLL_S]
        if self.limits.trial_timeout:
            due += [w.started + self.limits.trial_timeout - now for w in self.running]
        if self.limits.deadline is not None:
            due.append(self.limits.deadline - now)
        return max(0.0, min(due))

    def _read(self, w: _Worker) -> None:
        """Take what worker ``w`` sent; when it ended (its result, or EOF: it died), store its trials."""
        try:
            while w.conn.poll():
                msg = w.conn.recv()
                if msg[0] == "step":
                    w.steps[msg[1]] = msg[2]
                    self.bars.update(next(ts for ts in w.unit.specs if ts.key == msg[1]), msg[2], msg[3])
                else:
                    w.out = msg
                    break
        except (EOFError, OSError):
            w.out = w.out or ("died", None)
        if w.out is None:
            return
        w.proc.join(timeout=10)
        if w.proc.is_alive():  # it sent its result but does not exit (a thread of a plugin's): end it
            self._end(w)
        self._finish(w, self._results(w))

    def _results(self, w: _Worker) -> list[TrialResult]:
        kind, payload = w.out
        if kind == "done":
            return w.unit.results(payload, log=self.log)
        return w.unit.results(None, payload if kind == "error" else _death(w.proc.exitcode))

    def _finish(self, w: _Worker, results: list[TrialResult]) -> None:
        self.running.remove(w)
        w.conn.close()
        for ts, result in zip(w.unit.specs, results):
            self.bars.close(ts.key)
            self.on_done(ts, result)

    def _enforce(self) -> None:
        """End the workers past ``--trial-timeout`` or the spent budget; their trials are timed out."""
        now = time.monotonic()
        for w in list(self.running):
            over = self.limits.trial_timeout is not None and now - w.started >= self.limits.trial_timeout
            if not over and not self.limits.spent(now):
                continue
            self._end(w)
            what = (f"exceeded --trial-timeout {self.limits.trial_timeout:g} s" if over else
                    f"was running when the run's --time-budget of {self.limits.budget:g} s was spent")
            self._finish(w, [timed_out(ts, f"trial {what} at step {_step(w, ts)}; its worker process was ended",
                                       now - w.started) for ts in w.unit.specs])

    @staticmethod
    def _end(w: _Worker) -> None:
        if w.proc.is_alive():
            w.proc.kill()
        w.proc.join(timeout=10)


def _step(w: _Worker, ts: TrialSpec) -> str:
    """``"N of STEPS"``: the last training step the trial's worker reported (0: none yet)."""
    return f"{w.steps.get(ts.key, 0)} of {ts.config['train']['steps']}"


def _death(exitcode: int | None) -> str:
    how = f"killed by signal {-exitcode}" if exitcode is not None and exitcode < 0 else f"exit code {exitcode}"
    return (f"worker process died while running this trial ({how}; a signal or the out-of-memory killer) "
            f"before it sent a result")


def run_limited(specs: list[TrialSpec], jobs: int, on_done: OnDone, limits: Limits, threads: int | None = None,
                bars: TrialBars | None = None, vectorise: bool = False, capture: str = "auto",
                log: Callable[[str], None] | None = None) -> list[TrialSpec]:
    """Run ``specs`` under ``limits``, each unit in a worker process of its own (see the module docstring).

    Args:
        specs: the trials. jobs: units at a time (>= 1). threads: intra-op threads per worker.
        on_done: called in this process with ``(trial_spec, result)`` as each trial ends or is ended.
        limits: :class:`Limits` (from :meth:`Limits.start`).
        vectorise: units are vectorised trial groups (:func:`harness.group.group_specs`) with ``capture``.
        log: a group's fallback lines.

    Returns:
        the trials left unstarted because the time budget was spent (in plan order).

    Raises:
        KeyboardInterrupt: passed on after every worker has been ended.
    """
    from ..env import threads_per_trial

    sched = _Scheduler(plan_units(list(specs), vectorise, capture), max(1, jobs), threads_per_trial(jobs, threads),
                       on_done, bars or TrialBars(False), limits, log)
    return sched.run()


__all__ = ["Limits", "run_limited", "timed_out", "TIMED_OUT", "OUT_OF_TIME"]


def out_of_time(meta, limits: "Limits | None", unstarted: int, store, log) -> None:
    """A run (its :class:`harness.runmeta.RunMeta` ``meta``, :class:`harness.store.RunStore` ``store``) whose
    ``--time-budget`` left ``unstarted`` trials unstarted: status ``out_of_time``, one log line."""
    if limits is None or not limits.spent():
        return
    meta.status = OUT_OF_TIME
    if log:
        log(f"time budget of {limits.budget:g} s spent: {unstarted} trial(s) not started; "
            f"finish with: python -m harness run --resume {store.root}")


def stopped(exc: OSError, store, meta, t0: float | None) -> ResourceError:
    """The one-line error of a run stopped because one of its files could not be written: what failed,
    the file, how many planned trials are stored (a trial file is renamed into place only once whole,
    :func:`harness.store.atomic_write_bytes`) and how to resume. ``config.json`` says ``stopped``
    where it can still be written."""
    if t0 is not None:
        meta.run_wall_s = float(meta.run_wall_s or 0.0) + time.perf_counter() - t0
    meta.status = "stopped"
    with contextlib.suppress(OSError):
        store.write_meta(meta)
    planned = meta.planned_keys()
    done = len(store.done_keys() & set(planned))
    return ResourceError(f"{resource_text(exc)}; {done} of {len(planned)} trial(s) are stored in {store.root}; "
                         f"free space (or fix the permissions), then resume with: "
                         f"python -m harness run --resume {store.root}")
