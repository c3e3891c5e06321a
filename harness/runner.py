"""Turn a selection of variants x seeds (x sweep points) into trial specs, execute them and
store each result the moment it finishes."""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from .config import RunConfig
from .progress import TrialBars, progress_bar
from .registry import Variant
from .store import RunStore
from .trial import TrialSpec


#: Largest ``--jobs`` (worker processes) and ``--threads`` (threads per trial) accepted.
MAX_WORKERS = 1024

#: Most trials one run may plan (variants x seeds x sweep points). The plan is held in memory
#: and stored in config.json, so a mistyped ``--seeds 1000000000`` must be refused, not built.
MAX_TRIALS = 10_000

#: ``--vectorize-seeds`` choices (:class:`ExecutionOptions`), and the most seeds one vectorised group trains.
VECTORIZE = ("auto", "on", "off")
MAX_GROUP = 64
#: ``--capture`` choices (:class:`ExecutionOptions`).
CAPTURE = ("auto", "on", "off")


def check_plan_size(n_variants: int, n_seeds: int, n_points: int = 1) -> None:
    """Refuse a plan of more than :data:`MAX_TRIALS` trials before it is built.

    Raises:
        ConfigError: naming the product and the limit.
    """
    from .errors import ConfigError

    total = n_variants * n_seeds * n_points
    if total > MAX_TRIALS:
        raise ConfigError(f"the run would have {n_variants} variant(s) x {n_seeds} seed(s) x {n_points} config(s) = "
                          f"{total} trials; at most {MAX_TRIALS} per run (split it into several runs)")


@dataclass
class Plan:
    """What a run trains (or measures): variants x seeds x sweep points (each point a name and a config).

    Built from a request's variants, preset and seeds by :func:`harness.launch.plan_run` or from an
    experiment file by :func:`harness.experiments.plan_from_experiment`; ``points`` holds
    ``("", cfg)`` when nothing is swept.
    """

    variants: list[Variant]
    seeds: list[int]
    points: list[tuple[str, RunConfig]]
    preset: str = ""
    name: str = ""
    #: extra entries for the run's config.json (an experiment stores its parsed file here)
    meta: dict = field(default_factory=dict)
    #: the run's ``config.json`` kind: ``train``, or a measurement kind (``grad_norm_at_init``)
    kind: str = "train"
    #: None for training; for experiments that measure without training (e.g. gradient norms at
    #: initialisation), what every trial measures (``TrialSpec.measure``: ``{"kind", ...}``)
    measure: dict[str, Any] | None = None

    @property
    def config(self) -> RunConfig:
        return self.points[0][1]


@dataclass
class PlannedTrial:
    """One trial of a run's plan: its store key and its spec as the plain dict that crosses
    process boundaries and is stored in ``config.json`` (``harness.trial.TrialSpec.to_dict()``;
    :attr:`trial` gives it typed)."""

    key: str
    spec: dict[str, Any]

    @property
    def trial(self) -> TrialSpec:
        """The spec as a :class:`harness.trial.TrialSpec`."""
        return TrialSpec.from_dict(self.spec)


def make_specs(variants: Iterable[Variant], seeds: Iterable[int], cfg: RunConfig, device: str,
               dtype: str, plugins: dict, points: list[tuple[str, RunConfig]] | None = None,
               threads: int | None = None, measure: dict[str, Any] | None = None) -> list[PlannedTrial]:
    """Planned trials in execution order: seed-major, so an interrupted run has every variant
    at the first seeds rather than every seed of the first variants. ``measure``: what every
    trial measures instead of training (``TrialSpec.measure``), None for training."""
    points = points or [("", cfg)]
    out = []
    for seed in seeds:
        for point, pcfg in points:
            for v in variants:
                spec = TrialSpec(v.name, seed, pcfg.to_dict(), slots=dict(v.slots), device=device, dtype=dtype,
                                   plugins=plugins, threads=threads, point=point, measure=measure)
                out.append(PlannedTrial(spec.key, spec.to_dict()))
    return out


@dataclass
class ExecutionOptions:
    """How trials are executed (``run --jobs/--executor/--address/--threads``).

    Args:
        executor: ``local`` (this process when ``jobs == 1``, else a process pool) or ``ray``.
        jobs: concurrent local worker processes (``local`` only), >= 1.
        threads: torch intra-op threads per trial; default ``max(1, cores // jobs)`` locally,
            1 on Ray (where it is also the CPUs reserved per task).
        address: Ray cluster address (``ray`` only); default ``RAY_ADDRESS`` or a local cluster.
        vectorize_seeds: ``on``: the seeds of one variant x config train as vectorised trial groups
            in this process (:mod:`harness.group`); ``off``: one trial after another; ``auto``
            (resolved by :meth:`resolved`): ``on`` on CUDA with the local executor and one job,
            where it pays, ``off`` on the CPU, where it measured 0.87-1.24x.
        capture: the training step of a vectorised trial group as CUDA graphs
            (:class:`harness.vstep.CapturedStep`): ``auto`` (on with CUDA, unless the environment
            variable ``HARNESS_CAPTURE`` says ``off``), ``on`` (CUDA only: refused on the CPU by
            :meth:`resolved`), ``off``.
    """

    executor: str = "local"
    jobs: int | str = 1
    threads: int | None = None
    address: str | None = None
    vectorize_seeds: str = "auto"
    capture: str = "auto"

    def validate(self) -> "ExecutionOptions":
        from .errors import ConfigError, UnknownNameError
        from .executors import EXECUTORS

        if self.executor not in EXECUTORS:
            raise UnknownNameError("executor", self.executor, EXECUTORS)
        if self.jobs != "auto" and (not isinstance(self.jobs, int) or self.jobs < 1):
            raise ConfigError(f"--jobs must be 'auto' or >= 1, got {self.jobs}")
        if self.jobs != "auto" and self.jobs > MAX_WORKERS:
            raise ConfigError(f"--jobs must be at most {MAX_WORKERS}, got {self.jobs}")
        if self.threads is not None and not 1 <= self.threads <= MAX_WORKERS:
            raise ConfigError(f"--threads must be between 1 and {MAX_WORKERS}, got {self.threads}")
        if self.executor == "ray" and self.jobs not in (1, "auto"):
            raise ConfigError("--jobs applies to local worker processes; with --executor ray the cluster's "
                              "CPUs decide the parallelism (use --threads for CPUs per trial)")
        if self.address and self.executor != "ray":
            raise ConfigError(f"--address {self.address} needs --executor ray")
        if self.vectorize_seeds not in VECTORIZE:
            raise ConfigError(f"--vectorize-seeds must be one of {', '.join(VECTORIZE)}, got {self.vectorize_seeds!r}")
        if self.vectorize_seeds == "on" and (self.executor != "local" or self.jobs not in (1, "auto")):
            raise ConfigError("--vectorize-seeds on trains each group of seeds in this process: use it with the "
                              f"local executor and --jobs 1 (got --executor {self.executor} --jobs {self.jobs})")
        if self.capture not in CAPTURE:
            raise ConfigError(f"--capture must be one of {', '.join(CAPTURE)}, got {self.capture!r}")
        if self.capture == "on" and self.vectorize_seeds == "off":
            raise ConfigError("--capture on captures the steps of vectorised trial groups: it needs --vectorize-seeds "
                              "on or auto, not off")
        return self

    def resolved(self, n_trials: int, device: str) -> "ExecutionOptions":
        """These options with ``jobs="auto"`` made a number: on the CPU, one worker process per
        core (at most one per trial) with one thread each; on CUDA, on Ray or for a single
        trial, 1 (this process).

        Why: at the ``quick`` preset's sizes a step is hundreds of small ops, so a second
        intra-op thread gains little (1.2-1.6x per step measured on 2 cores), while two
        one-thread trials side by side gain nearly 2x: ``run --variants all`` took 122 s
        with one process x 2 threads and 77 s with 2 processes x 1 thread (docs/benchmarks.md).
        Timings per trial are then taken with 1 thread next to another trial; for speed
        comparisons use ``harness bench`` (one process, interleaved) or ``--jobs 1``.
        """
        if self.capture == "on" and not device.startswith("cuda"):
            from .errors import ConfigError

            raise ConfigError(f"--capture on needs a CUDA device (CUDA graphs); this run's device is {device}: "
                              "use --capture auto or off")
        if self.vectorize_seeds == "auto":
            on = device.startswith("cuda") and self.executor == "local" and self.jobs in (1, "auto")
            return dataclasses.replace(self, vectorize_seeds="on" if on else "off").resolved(n_trials, device)
        if self.jobs != "auto":
            return self
        from .executors import available_cores

        jobs = 1
        if self.executor == "local" and device == "cpu" and n_trials > 1 and self.vectorize_seeds != "on":
            jobs = max(1, min(n_trials, available_cores() // max(1, int(self.threads or 1))))
        return dataclasses.replace(self, jobs=jobs)

    def trial_threads(self) -> int:
        """Intra-op threads each trial runs with under these options."""
        from .executors import threads_per_trial

        if self.executor == "ray":
            return int(self.threads or 1)
        return threads_per_trial(self.jobs, self.threads)

    def describe(self) -> str:
        if self.executor == "ray":
            from .executors import ray_address

            return f"ray cluster {ray_address(self.address)}, {self.trial_threads()} thread(s) per trial"
        if self.vectorize_seeds == "on":
            return f"this process, {self.trial_threads()} thread(s), seeds vectorised in groups of up to {MAX_GROUP}"
        if self.jobs == 1:
            return f"this process, {self.trial_threads()} thread(s)"
        return f"{self.jobs} worker processes x {self.trial_threads()} thread(s)"

    def to_dict(self) -> dict[str, Any]:
        return {"executor": self.executor, "jobs": self.jobs, "threads": self.threads, "address": self.address,
                "vectorize_seeds": self.vectorize_seeds, "capture": self.capture}


def with_threads(specs: Iterable[PlannedTrial], threads: int) -> list[PlannedTrial]:
    """Copies of ``specs`` whose ``spec["threads"]`` is ``threads``."""
    return [PlannedTrial(ts.key, {**ts.spec, "threads": threads}) for ts in specs]


def execute(specs: list[PlannedTrial], store: RunStore, options: ExecutionOptions | None = None,
            quiet: bool = False, log: Callable[[str], None] | None = None,
            after_store: Callable[[str, dict], None] | None = None) -> list[dict]:
    """Run ``specs`` with the chosen executor (:mod:`harness.executors`) and store each trial
    the moment it ends (:meth:`RunStore.write_trial`, atomic). Returns the results in
    completion order.

    Progress: a bar over trials (with ETA) and one bar per running trial, on stderr, silent
    with ``quiet`` or when stderr is not a terminal; ``log`` receives one line per finished
    trial naming the file it was stored in. Weights a trial returned (``--save-models``) go to
    ``models/<key>.pt`` first (:func:`harness.saved.store_weights`); ``after_store(key, result)``
    runs once each trial is stored (``--tensorboard``: :func:`harness.tboard.trial_writer`).

    Raises:
        KeyboardInterrupt: Ctrl-C / SIGTERM; every trial finished before it is stored.
        HarnessError: the executor cannot start (e.g. Ray missing or unreachable).
    """
    from . import executors
    from .saved import store_weights

    options = (options or ExecutionOptions()).validate()
    specs = with_threads(specs, options.trial_threads())
    results: list[dict] = []
    outer = progress_bar(len(specs), "trials", quiet)
    bars = TrialBars(enabled=not outer.disable)
    started = time.perf_counter()

    def on_done(ts: PlannedTrial, result: dict) -> None:
        result["row"].setdefault("point", ts.spec.get("point", ""))
        store_weights(store.root, ts.key, result)
        path = store.write_trial(ts.key, result)
        if after_store is not None:
            after_store(ts.key, result)
        results.append(result)
        outer.update(1)
        if log:
            log(trial_line(result["row"], path, len(results), len(specs), time.perf_counter() - started))

    try:
        if options.executor == "ray":
            executors.run_ray(specs, on_done, address=options.address, cpus_per_trial=options.trial_threads(),
                              gpus_per_trial=1 if any(str(ts.spec.get("device", "")).startswith("cuda")
                                                      for ts in specs) else 0, log=log)
        elif options.vectorize_seeds == "on":
            from .group import run_groups

            run_groups(specs, on_done, bars, log, max_size=MAX_GROUP, capture=options.capture)
        elif options.jobs > 1 and len(specs) > 1:
            executors.run_process_pool(specs, options.jobs, on_done, threads=options.trial_threads(), bars=bars)
        else:
            executors.run_sequential(specs, on_done, bars)
    finally:
        bars.close_all()
        outer.close()
    return results


def trial_line(row: dict, path, n: int, total: int, elapsed_s: float) -> str:
    """The log line of one finished trial: status, exact-match, trial time and where it is stored."""
    em = row.get("exact_match")
    em_s = f" exact-match {em:.3f}" if isinstance(em, float) and em == em else ""
    wall = row.get("wall_s")
    wall_s = f" in {wall:.1f} s" if isinstance(wall, float) and wall == wall else ""
    reason = f" ({row['reason']})" if row.get("reason") else ""
    point = f" [{row['point']}]" if row.get("point") else ""
    return (f"[{n}/{total} {elapsed_s:.0f} s] {row['variant']}{point} seed {row['seed']}: {row['status']}"
            f"{em_s}{wall_s}{reason} -> stored in {path}")
