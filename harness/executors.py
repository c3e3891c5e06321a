"""Where trials run: in this process, in a pool of local worker processes, or on a Ray cluster.

Every executor receives :class:`harness.trial.TrialSpec` s and calls
``on_done(spec, result)`` with a :class:`harness.trial.TrialResult` **in the parent process** as
each trial ends, in completion order; the caller stores the result at once
(:meth:`harness.store.RunStore.write_trial`). A trial crosses a process boundary as an importable
function (:func:`pool_trial`, :func:`ray_trial`) plus its spec's plain dict
(``TrialSpec.to_dict()``), and comes back as the result's dict (``TrialResult.to_dict()``), never
as a pickled model or closure: those two calls, here, are the only place the records are dicts
outside the files.

* :func:`run_sequential` (``--jobs 1``): one trial after the other in this process.
* :func:`run_process_pool` (``--jobs N``): N worker processes from ProcessPoolExecutor, each task a trial
  or, with vectorised seeds, a trial group (:func:`harness.group.pool_group`); started with
  :data:`START_METHOD` (no inherited OpenMP or CUDA state). Each worker calls
  ``torch.set_num_threads(threads)`` with ``threads = max(1, cores // N)`` unless ``--threads``
  says otherwise, so N workers never oversubscribe the cores. A worker that dies (killed by a
  signal or by the out-of-memory killer) breaks the pool; the trials it may have been running
  are then re-run one after the other in a one-worker pool, and the one that kills that worker
  too is recorded as ``failed`` -- the run goes on.
* :func:`run_ray` (``--executor ray``): Ray tasks with ``num_cpus = threads`` (and
  ``num_gpus = 1`` on CUDA). ``--address`` or ``RAY_ADDRESS`` name an existing cluster;
  otherwise a private local cluster on loopback is started with ``ray.init(address="local")``
  and shut down at the end.

Results are bitwise reproducible across executors for the same seed, config, device and
threads per trial: the number of intra-op threads changes the order of floating-point
reductions, so it is part of each trial's spec and recorded in each row.
"""
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
from typing import Any, Callable, Iterable

from .errors import HarnessError, failure_reason
from .progress import TrialBars
from .env import available_cores, ray_address, threads_per_trial
from .trial import TrialResult, TrialSpec
from .workers import FORKSERVER_PRELOAD, START_METHOD


#: Seconds between progress messages a worker sends for its trial's bar.
PROGRESS_EVERY_S = 0.2

WORKER_DIED = ("worker process died while running this trial (killed by a signal or by the "
               "out-of-memory killer); it died again when re-run in a worker of its own")

OnDone = Callable[[TrialSpec, TrialResult], None]


def pool_trial(spec: dict[str, Any], progress=None) -> dict[str, Any]:
    """The process-pool boundary: :func:`harness.train.run_trial` on ``TrialSpec.from_dict(spec)``,
    its result as ``TrialResult.to_dict()`` (what a worker sends back)."""
    from .train import run_trial

    return run_trial(TrialSpec.from_dict(spec), progress=progress).to_dict()


# ---------------------------------------------------------------------------------------------
# sequential


def run_sequential(specs: Iterable[TrialSpec], on_done: OnDone, bars: TrialBars | None = None) -> None:
    """Run ``specs`` one after the other in this process (``--jobs 1``)."""
    from .train import run_trial

    bars = bars or TrialBars(False)
    for ts in specs:
        def progress(step, loss, ts=ts):
            bars.update(ts, step, loss)

        try:
            result = run_trial(ts, progress=progress if bars.enabled else None)
        finally:
            bars.close(ts.key)
        on_done(ts, result)


# ---------------------------------------------------------------------------------------------
# local process pool

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


def _submit(pool, unit: list[TrialSpec], queue, capture: str | None):
    """One unit of work to a worker: a trial (``capture`` None: :func:`pool_trial`) or a trial
    group (:func:`harness.group.pool_group` with ``run --capture``)."""
    progress = [QueueProgress(ts.key, ts.config["train"]["steps"]) if queue is not None else None for ts in unit]
    if capture is None:
        return pool.submit(pool_trial, unit[0].to_dict(), progress[0])
    from .group import pool_group

    return pool.submit(pool_group, [ts.to_dict() for ts in unit], progress, capture)


def _pool_round(todo: list[list[TrialSpec]], jobs: int, threads: int, on_done: OnDone, bars: TrialBars,
                ctx, capture: str | None = None, log: Callable[[str], None] | None = None) -> tuple[list, list]:
    """Run ``todo`` (units: one trial each, or trial groups with ``capture``) in one pool. Returns ``(unfinished,
    suspects)``: the units lost when a worker died (empty when none did), those of them maybe running."""
    queue = ctx.Queue() if bars.enabled else None
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=ctx, initializer=init_worker,
                               initargs=(threads, queue, os.getpid()))
    opened, first = time.time(), float("inf")  # when the pool opened; when its first trial group began
    futures: dict = {}
    by_key = {ts.key: ts for unit in todo for ts in unit}
    seen_running: set = set()
    lost: list = []
    try:
        with sigint_ignored(), main_module_hidden():
            for unit in todo:
                futures[_submit(pool, unit, queue, capture)] = unit
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
            _drain(queue, by_key, bars)
            seen_running.update(f for f in pending if f.running())
            for fut in sorted(done, key=lambda f: futures[f][0].key):
                unit, exc = futures[fut], fut.exception()
                if isinstance(exc, BrokenProcessPool):
                    lost.append(fut)
                    continue
                for ts, result in zip(unit, _unit_results(unit, fut, exc, capture, log)):
                    bars.close(ts.key)
                    on_done(ts, result)
                if capture is not None and exc is None:  # a group's result says when its worker began it
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


def _unit_results(unit: list[TrialSpec], fut, exc: BaseException | None, capture: str | None,
                  log: Callable[[str], None] | None) -> list[TrialResult]:
    """The results of a finished unit, in its order: the worker's, or each trial ``failed`` with the
    exception's reason; a group's log lines (a fallback to sequential trials) go to ``log``."""
    if exc is not None:
        return [TrialResult.failed(ts, failure_reason(exc)) for ts in unit]
    out = fut.result()
    if capture is None:
        return [TrialResult.from_dict(out)]
    for line in out["log"] if log else ():
        log(line)
    return [TrialResult.from_dict(d) for d in out["results"]]


def run_process_pool(specs: Iterable[TrialSpec], jobs: int, on_done: OnDone, threads: int | None = None,
                     bars: TrialBars | None = None, start_method: str = START_METHOD, capture: str | None = None,
                     log: Callable[[str], None] | None = None) -> None:
    """Run ``specs`` in ``jobs`` worker processes (``--jobs N``).

    Args:
        specs: the trials; their ``threads`` should equal ``threads`` (the worker pins it either way).
        jobs: worker processes (>= 1).
        on_done: called in this process with ``(trial_spec, result)`` as each trial ends.
        threads: intra-op threads per worker (default ``max(1, cores // jobs)``).
        bars: per-trial progress bars fed from the workers through a queue.
        start_method: :data:`START_METHOD` (``forkserver`` where available) or ``spawn``.
        capture: None: one trial per task; else ``run --capture``, each task a vectorised trial group
            (``--vectorise-seeds on --jobs N``); ``log`` gets a group's line when it falls back.

    Raises:
        KeyboardInterrupt: passed on after the workers have been terminated.
    """
    from .group import group_specs
    from .runmeta import MAX_GROUP

    ctx = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
    threads = threads_per_trial(jobs, threads)
    bars = bars or TrialBars(False)
    units = [[ts] for ts in specs] if capture is None else group_specs(list(specs), MAX_GROUP)
    run = lambda todo, n: _pool_round(todo, n, threads, on_done, bars, ctx, capture, log)  # noqa: E731
    unfinished, suspects = run(units, jobs)
    while unfinished:
        # A worker died. Re-run the units that may have been on it in a pool of one worker, in order: when it
        # dies too, the earliest unfinished unit was running; its trials are failed, the others go on.
        solo = suspects
        while solo:
            lost, _ = run(solo, 1)
            if not lost:
                break
            for ts in lost[0]:
                on_done(ts, TrialResult.failed(ts, WORKER_DIED))
            solo = lost[1:]
        rest = [unit for unit in unfinished if unit not in suspects]
        if not rest:
            break
        unfinished, suspects = run(rest, jobs)


# ---------------------------------------------------------------------------------------------
# Ray


def import_ray():
    """``import ray`` or a one-line HarnessError saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise HarnessError("--executor ray needs Ray, which is not installed "
                           "(pip install -e '.[ray]', or pip install 'ray>=2.9')") from exc
    return ray


def ray_trial(spec: dict, plugin_sources: dict[str, str]) -> dict:
    """The Ray task (the Ray boundary): :func:`harness.train.run_trial` on
    ``TrialSpec.from_dict(spec)``, its result as ``TrialResult.to_dict()``.

    Plugin files named with ``--plugin`` travel as source text in ``plugin_sources`` (absolute
    path -> text); on a node where the path does not exist the file is written to a private
    cache folder and loaded from there, so a cluster needs no shared file system.
    """
    from .train import run_trial

    trial = TrialSpec.from_dict(spec)
    files = (trial.plugins or {}).get("files") or []
    if any(not os.path.isfile(f) for f in files):
        trial.plugins = dict(trial.plugins or {}, files=[_localise(f, plugin_sources) for f in files])
    return run_trial(trial).to_dict()


def _localise(path: str, sources: dict[str, str]) -> str:
    if os.path.isfile(path) or path not in sources:
        return path
    import hashlib
    import tempfile

    text = sources[path]
    folder = os.path.join(tempfile.gettempdir(), "harness-plugins",
                          hashlib.sha256(text.encode()).hexdigest()[:16])
    os.makedirs(folder, exist_ok=True)
    local = os.path.join(folder, os.path.basename(path))
    if not os.path.isfile(local):
        tmp = f"{local}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, local)
    return local


def _runtime_env(address: str, plugin_modules: list[str]) -> dict:
    """Ray runtime environment of the tasks.

    On an existing cluster (any address but ``local``) the ``harness`` and ``variants``
    packages and the ``-p`` plugin modules are uploaded with ``py_modules``, so the nodes need
    only the dependencies (torch, pluggy, pandas ...), not this checkout. The plugin-autoload
    switch travels as an environment variable so every worker loads the same plugins.
    """
    env: dict[str, Any] = {}
    env_vars = {k: os.environ[k] for k in ("HARNESS_DISABLE_PLUGIN_AUTOLOAD",) if k in os.environ}
    if address == "local":
        # same machine: workers see this checkout; make -p modules found from here importable
        paths = [os.getcwd()] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if plugin_modules:
            env_vars["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    else:
        import importlib

        import harness

        from .plugins import BUILTIN_MODULES

        mods = [harness]
        for name in [*BUILTIN_MODULES, *plugin_modules]:  # the built-in plugins' packages, as any plugin's
            top = importlib.import_module(name.split(".")[0])
            if top not in mods:
                mods.append(top)
        env["py_modules"] = mods
    if env_vars:
        env["env_vars"] = env_vars
    return env


@contextlib.contextmanager
def ray_session(address: str | None = None, plugin_modules: list[str] | None = None,
                log: Callable[[str], None] | None = None):
    """Connect to (or start) the Ray cluster for the duration of the block; yields ``ray``.

    ``address`` as for :func:`ray_address`. A cluster this call starts (``local``) is shut down
    at the end; if Ray is already initialised in this process it is used as it is.

    Raises:
        HarnessError: Ray is missing or the cluster cannot be started or reached.
    """
    ray = import_ray()
    address = ray_address(address)
    started = False
    if not ray.is_initialized():
        if address == "local":
            # keep a private cluster on loopback and silent (no usage stats, no dashboard)
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        kwargs: dict[str, Any] = dict(address=address, runtime_env=_runtime_env(address, plugin_modules or []),
                                      log_to_driver=False, logging_level="ERROR")
        if address == "local":
            kwargs.update(include_dashboard=False, num_cpus=available_cores())
        try:
            ray.init(**kwargs)
        except Exception as exc:  # noqa: BLE001 - Ray raises many types for a bad address
            first = failure_reason(exc, limit=10_000).removeprefix(f"{type(exc).__name__}: ")
            raise HarnessError(f"cannot start or reach the Ray cluster at {address!r}: {first} "
                               f"(check --address / RAY_ADDRESS, or leave both unset for a local cluster)") from exc
        started = True
    try:
        if log and started:
            res = ray.cluster_resources()
            log(f"ray cluster {address}: {int(res.get('CPU', 0))} CPU(s), {int(res.get('GPU', 0))} GPU(s)")
        yield ray
    finally:
        if started:
            with contextlib.suppress(Exception):
                ray.shutdown()


def run_ray(specs: Iterable[TrialSpec], on_done: OnDone, address: str | None = None, cpus_per_trial: int = 1,
            gpus_per_trial: float = 0, log: Callable[[str], None] | None = None) -> None:
    """Run ``specs`` as Ray tasks (``--executor ray``), storing each as it ends.

    Args:
        specs: the trials (their ``threads`` = ``cpus_per_trial``).
        on_done: called in this process with ``(trial_spec, result)`` as each trial ends.
        address: cluster address (``ray://host:10001`` or ``host:6379``); default
            ``RAY_ADDRESS`` or a new local cluster (see :func:`ray_address`). Ignored when Ray is
            already initialised (e.g. inside :func:`ray_session`).
        cpus_per_trial: CPUs Ray reserves per task; the task uses that many torch threads.
        gpus_per_trial: GPUs per task (1 for ``--device cuda``).
        log: receives one line when the cluster is up.

    Raises:
        HarnessError: Ray missing, or the cluster cannot be reached.
        KeyboardInterrupt: passed on after the remaining tasks are cancelled.
    """
    specs = list(specs)
    plugins = (specs[0].plugins or {}) if specs else {}
    sources = {}
    for f in plugins.get("files") or []:
        with open(f, encoding="utf-8") as fh:
            sources[f] = fh.read()
    with ray_session(address, plugins.get("modules") or [], log) as ray:
        task = ray.remote(ray_trial).options(num_cpus=cpus_per_trial, num_gpus=gpus_per_trial, max_retries=1)
        refs = {task.remote(ts.to_dict(), sources): ts for ts in specs}
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1, timeout=1.0)
                for ref in done:
                    ts = refs[ref]
                    try:
                        result = TrialResult.from_dict(ray.get(ref))
                    except ray.exceptions.RayError as exc:  # the task or its worker died
                        result = TrialResult.failed(ts, f"ray: {failure_reason(exc)}")
                    on_done(ts, result)
        except BaseException:
            for ref in pending:
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=True)
            raise


__all__ = ["pool_trial", "TrialBars", "run_sequential", "run_process_pool", "run_ray", "ray_session", "ray_trial", "import_ray"]
