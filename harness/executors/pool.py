"""A pool of local worker processes (``--jobs N``): each task a :class:`~harness.executors.units.WorkUnit`; the
workers' set-up (threads, progress queue, exit with the run), which the time-limited workers share."""
from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import signal
import sys
import threading
import time
import types
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Callable, Iterable

from ..env import threads_per_trial
from ..errors import failure_reason
from ..progress import TrialBars
from ..trial import TrialSpec
from ..workers import FORKSERVER_PRELOAD, START_METHOD
from .units import OnDone, WorkUnit, plan_units, run_unit

#: Seconds between progress messages a worker sends for its trial's bar.
PROGRESS_EVERY_S = 0.2

WORKER_DIED = ("worker process died while running this trial (killed by a signal or by the "
               "out-of-memory killer); it died again when re-run in a worker of its own")


_WORKER_PROGRESS = None  # the worker's end of the progress queue (set by init_worker)


def init_worker(threads: int, progress_queue, run_pid: int) -> None:
    """Initializer of every pool worker: ignore Ctrl-C (the parent decides), pin the thread
    count, keep the progress queue, and exit when the run's process ``run_pid`` dies (even by
    SIGKILL), so no worker outlives the run."""
    global _WORKER_PROGRESS
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import torch

    torch.set_num_threads(threads)
    _WORKER_PROGRESS = progress_queue
    threading.Thread(target=_exit_with_run, args=(run_pid, os.getppid()), daemon=True,
                     name="harness-run-watch").start()


def _process_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (a killed run not yet reaped by its shell)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _exit_with_run(run_pid: int, parent_pid: int) -> None:
    # Under forkserver the parent is the fork server, which itself waits for its workers to
    # exit before it does, so the run's own process is watched too.
    while True:
        time.sleep(1.0)
        if os.getppid() != parent_pid or not _process_alive(run_pid):
            os._exit(1)


class QueueProgress:
    """Picklable ``progress(step, loss)`` callback for :func:`harness.train.run_trial` in a
    pool worker: sends ``(key, step, loss)`` to the parent at most every
    :data:`PROGRESS_EVERY_S` seconds, and always at the last of ``steps`` (the bar then says the
    final evaluation runs)."""

    def __init__(self, key: str, steps: int = 0):
        self.key, self.steps = key, steps
        self._last = -math.inf  # the first step always goes out (time.monotonic() may be small after a boot)

    def __call__(self, step: int, loss: float) -> None:
        now = time.monotonic()
        due = now - self._last >= PROGRESS_EVERY_S or (self.steps and step >= self.steps)
        if _WORKER_PROGRESS is not None and due:
            self._last = now
            try:
                _WORKER_PROGRESS.put_nowait((self.key, step, loss))
            except Exception:  # noqa: BLE001 - progress is best effort
                pass


@contextlib.contextmanager
def sigint_ignored():
    """Ignore SIGINT while workers are spawned: they inherit SIG_IGN, so Ctrl-C in the
    terminal reaches only the parent, which then stops them (no worker tracebacks)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


@contextlib.contextmanager
def main_module_hidden():
    """While worker processes start, show them a bare ``__main__``: ``multiprocessing`` (``spawn``
    and ``forkserver``) otherwise re-runs the caller's script in every worker, so a plain script
    calling :func:`harness.run` without an ``if __name__ == "__main__":`` guard would start a run
    per worker. The workers need nothing from ``__main__`` (trial specs are plain data and plugins
    load by module path or file)."""
    real = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if real is not None:
            sys.modules["__main__"] = real


def _terminate(pool: ProcessPoolExecutor) -> None:
    """Stop a pool now: cancel what has not started and terminate the workers.

    ``ProcessPoolExecutor`` has no public way to stop running work before Python 3.14
    (``terminate_workers``); before that its private ``_processes`` map is the only handle.
    """
    stop = getattr(pool, "terminate_workers", None)
    if stop is not None:
        stop()
    else:
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            with contextlib.suppress(Exception):
                proc.terminate()
    pool.shutdown(wait=False, cancel_futures=True)


def _drain(queue, by_key: dict, bars: TrialBars) -> None:
    if queue is None:
        return
    while True:
        try:
            key, step, loss = queue.get_nowait()
        except Exception:  # noqa: BLE001 - queue.Empty, or a closed queue
            return
        if key in by_key:
            bars.update(by_key[key], step, loss)


def _submit(pool, unit: WorkUnit, queue):
    """One unit of work to a worker (:func:`~harness.executors.units.run_unit`), each trial's progress through
    ``queue`` when there are bars."""
    progress = [QueueProgress(ts.key, ts.config["train"]["steps"]) if queue is not None else None for ts in unit.specs]
    specs, capture = unit.payload()
    return pool.submit(run_unit, specs, progress, capture)


def _pool_round(todo: list[WorkUnit], jobs: int, threads: int, on_done: OnDone, bars: TrialBars,
                ctx, log: Callable[[str], None] | None = None) -> tuple[list, list]:
    """Run the units ``todo`` in one pool. Returns ``(unfinished,
    suspects)``: the units lost when a worker died (empty when none did), those of them maybe running."""
    queue = ctx.Queue() if bars.enabled else None
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=ctx, initializer=init_worker,
                               initargs=(threads, queue, os.getpid()))
    opened, first = time.time(), float("inf")  # when the pool opened; when its first trial group began
    futures: dict = {}
    by_key = {ts.key: ts for unit in todo for ts in unit.specs}
    seen_running: set = set()
    lost: list = []
    try:
        with sigint_ignored(), main_module_hidden():
            for unit in todo:
                futures[_submit(pool, unit, queue)] = unit
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
            _drain(queue, by_key, bars)
            seen_running.update(f for f in pending if f.running())
            for fut in sorted(done, key=lambda f: futures[f].key):
                unit, exc = futures[fut], fut.exception()
                if isinstance(exc, BrokenProcessPool):
                    lost.append(fut)
                    continue
                out = fut.result() if exc is None else None
                for ts, result in zip(unit.specs, unit.results(out, None if exc is None else failure_reason(exc), log)):
                    bars.close(ts.key)
                    on_done(ts, result)
                if unit.grouped and exc is None:  # when the worker began the group: the pool's start-up cost
                    first = min(first, fut.result().get("started", first))
    except BaseException:
        _terminate(pool)
        raise
    finally:
        bars.close_all()
        if queue is not None:
            queue.close()
            queue.cancel_join_thread()
    pool.shutdown(wait=True)
    if log and first < float("inf"):  # the workers' start (fork server, imports), which a GPU run can wait on
        log(f"pool: {min(jobs, len(todo))} worker process(es); the first trial group began {first - opened:.1f} s "
            f"after the pool opened")
    unfinished = [unit for f, unit in futures.items() if f in lost]  # in submission order
    suspects = [unit for f, unit in futures.items() if f in lost and f in seen_running] or unfinished
    return unfinished, suspects


def run_process_pool(specs: Iterable[TrialSpec], jobs: int, on_done: OnDone, threads: int | None = None,
                     bars: TrialBars | None = None, start_method: str = START_METHOD, vectorise: bool = False,
                     capture: str = "auto", log: Callable[[str], None] | None = None) -> None:
    """Run ``specs`` in ``jobs`` worker processes (``--jobs N``).

    Args:
        specs: the trials; their ``threads`` should equal ``threads`` (the worker pins it either way).
        jobs: worker processes (>= 1).
        on_done: called in this process with ``(trial_spec, result)`` as each trial ends.
        threads: intra-op threads per worker (default ``max(1, cores // jobs)``).
        bars: per-trial progress bars fed from the workers through a queue.
        start_method: :data:`START_METHOD` (``forkserver`` where available) or ``spawn``.
        vectorise: each task a vectorised trial group (``--vectorise-seeds on --jobs N``;
            :func:`~harness.executors.units.plan_units`) with ``capture`` (``run --capture``); else one trial per
            task. ``log`` gets a group's line when it falls back.

    Raises:
        KeyboardInterrupt: passed on after the workers have been terminated.
    """
    ctx = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
    threads = threads_per_trial(jobs, threads)
    bars = bars or TrialBars(False)
    units = plan_units(list(specs), vectorise, capture)
    run = lambda todo, n: _pool_round(todo, n, threads, on_done, bars, ctx, log)  # noqa: E731
    unfinished, suspects = run(units, jobs)
    while unfinished:
        # A worker died. Re-run the units that may have been on it in a pool of one worker, in order: when it
        # dies too, the earliest unfinished unit was running; its trials are failed, the others go on.
        solo = suspects
        while solo:
            lost, _ = run(solo, 1)
            if not lost:
                break
            for ts, result in zip(lost[0].specs, lost[0].results(None, WORKER_DIED)):
                on_done(ts, result)
            solo = lost[1:]
        rest = [unit for unit in unfinished if unit not in suspects]
        if not rest:
            break
        unfinished, suspects = run(rest, jobs)

