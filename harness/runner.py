"""Turn a selection of variants x seeds (x sweep points) into trial specs, execute them and
store each result the moment it finishes.

The planned trials are :class:`harness.trial.TrialSpec` s and the executors hand back
:class:`harness.trial.TrialResult` s (``on_done(spec, result)``); plain dicts appear only where a
trial crosses a process or Ray boundary (:mod:`harness.executors`) and in the run's files
(:mod:`harness.store`). How trials run is one :class:`harness.runmeta.Execution` (the options a
request asks for and the record the run stores); its limits are re-exported here."""
from __future__ import annotations

import collections
import dataclasses
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from .config import RunConfig
from .progress import TrialBars, progress_bar
from .registry import Variant
from .runmeta import MAX_GROUP, Execution
from .store import RunStore
from .track import with_tracking
from .trial import TrialResult, TrialSpec


#: Most trials one run may plan (variants x seeds x sweep points). The plan is held in memory
#: and stored in config.json, so a mistyped ``--seeds 1000000000`` must be refused, not built.
MAX_TRIALS = 10_000



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


def lr_grid_points(cfg: RunConfig, grid: Iterable[float]) -> list[tuple[str, RunConfig]]:
    """``run --lr-grid``: one sweep point per learning rate, named ``lr=VALUE``, each ``cfg`` with
    ``train.lr`` = VALUE (the schedule's peak learning rate).

    Raises:
        ConfigError: an empty grid, a value that is not a positive finite number, a repeated value,
            or the ``noam`` schedule (whose step size is set by ``train.noam_factor``, not ``train.lr``).
    """
    import math

    from .errors import ConfigError

    grid = list(grid)
    if not grid:
        raise ConfigError("--lr-grid needs at least one learning rate, e.g. --lr-grid 3e-4,1e-3,3e-3")
    for lr in grid:
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
            raise ConfigError(f"--lr-grid: every learning rate must be a positive number, got {lr!r}")
    if len(set(grid)) != len(grid):
        raise ConfigError(f"--lr-grid: a learning rate is repeated in {', '.join(f'{v:g}' for v in grid)}")
    if cfg.train.schedule == "noam":
        raise ConfigError("--lr-grid sweeps train.lr, the peak learning rate, which the noam schedule does not have "
                          "(its step size is train.noam_factor * d_model^-0.5 * min(t^-0.5, t * warmup^-1.5)); add "
                          "--set train.schedule=cosine (or linear, wsd, constant)")
    return [(f"lr={lr:g}", cfg.override({"train.lr": float(lr)})) for lr in grid]


@dataclass
class Plan:
    """What a run trains (or measures): variants x seeds x sweep points (each point a name and a config).

    Built from a request's variants, preset and seeds by :func:`harness.planning.plan_run` or from an
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

    #: the run's own config when its points are derived from it (``run --lr-grid``), else None
    base: RunConfig | None = None

    @property
    def config(self) -> RunConfig:
        return self.base if self.base is not None else self.points[0][1]


def make_specs(variants: Iterable[Variant], seeds: Iterable[int], cfg: RunConfig, device: str,
               dtype: str, plugins: dict, points: list[tuple[str, RunConfig]] | None = None,
               threads: int | None = None, measure: dict[str, Any] | None = None) -> list[TrialSpec]:
    """The planned trials (:class:`harness.trial.TrialSpec` s, each with its store key ``.key``) in execution order: seed-major, so an interrupted run has every variant
    at the first seeds rather than every seed of the first variants. ``measure``: what every
    trial measures instead of training (``TrialSpec.measure``), None for training."""
    points = points or [("", cfg)]
    out = []
    for seed in seeds:
        for point, pcfg in points:
            for v in variants:
                out.append(TrialSpec(v.name, seed, pcfg.to_dict(), slots=dict(v.slots), device=device, dtype=dtype,
                                     plugins=plugins, threads=threads, point=point, measure=measure))
    return out


def with_threads(specs: Iterable[TrialSpec], threads: int) -> list[TrialSpec]:
    """Copies of ``specs`` whose ``threads`` is ``threads``."""
    return [dataclasses.replace(ts, threads=threads) for ts in specs]


def execute(specs: list[TrialSpec], store: RunStore, options: Execution | None = None,
            quiet: bool = False, log: Callable[[str], None] | None = None,
            after_store: Callable[[str, TrialResult], None] | None = None, track: dict | None = None,
            limits=None, keep_checkpoints=False) -> list[TrialResult]:
    """Run ``specs`` with the chosen executor (:mod:`harness.executors`) and store each trial the moment it
    ends (:meth:`RunStore.write_trial`, atomic), then remove its checkpoint unless ``keep_checkpoints``
    (:func:`harness.checkpoint.with_checkpoints`), and that of its vectorised group once the last of the
    group's seeds here is stored (:func:`harness.checkpoint.group_stem`). Returns the results in completion order.

    Progress: a bar over trials (with ETA) and one bar per running trial, on stderr, silent with ``quiet`` or when
    stderr is not a terminal; ``log`` receives one line per finished trial naming its file. Weights a trial returned
    (``--save-models``) go to ``models/<key>.pt`` first (:func:`harness.saved.store_weights`); ``after_store(key,
    result)`` runs once each trial is stored (:func:`harness.tboard.trial_writer`). ``track``: live tracking where
    the trials train (:func:`harness.track.with_tracking`; not on Ray). With a time limit: :func:`run_with_limits`.

    Raises: KeyboardInterrupt (Ctrl-C / SIGTERM; every trial finished before is stored); HarnessError: the
    executor cannot start (e.g. Ray missing or unreachable).
    """
    from .checkpoint import group_stem, remove_checkpoint, with_checkpoints
    from .saved import store_weights

    options = (options or Execution()).validate()
    specs = with_checkpoints(with_threads(specs, options.trial_threads()), store.root, options.executor)
    unstored = collections.Counter(group_stem(ts) for ts in specs)  # per group checkpoint, its seeds not yet stored
    specs = specs if options.executor == "ray" else with_tracking(specs, track)
    results: list[TrialResult] = []
    outer = progress_bar(len(specs), "trials", quiet)
    bars = TrialBars(enabled=not outer.disable)
    started, width = time.perf_counter(), _terminal_width()

    def on_done(ts: TrialSpec, result: TrialResult) -> None:
        result.row.setdefault("point", ts.point)
        store_weights(store.root, ts.key, result)
        path = store.write_trial(ts.key, result)
        remove_checkpoint(store.root, ts.key, keep=keep_checkpoints)
        unstored[group_stem(ts)] -= 1
        if not unstored[group_stem(ts)]:  # the last seed of its vectorised group (if any) is stored
            remove_checkpoint(store.root, group_stem(ts), keep=keep_checkpoints)
        if after_store is not None:
            after_store(ts.key, result)
        results.append(result)
        outer.update(1)
        if log:
            log(trial_line(result.row, path, len(results), len(specs), time.perf_counter() - started, width))

    try:
        dispatch(specs, options, on_done, bars, log, limits)
    finally:
        bars.close_all()
        outer.close()
    return results


def dispatch(specs: list[TrialSpec], options: Execution, on_done, bars: TrialBars, log, limits=None) -> None:
    """Hand ``specs`` to the executor ``options`` choose (:func:`execute`'s ``try`` block): under a time limit
    worker processes that can be ended, Ray, a process pool (of trials or of vectorised groups), vectorised groups
    in this process, or one trial after another; ``on_done(spec, result)`` stores each as it ends."""
    from .executors import pool, ray_cluster, sequential

    if options.limited():
        run_with_limits(specs, options, on_done, bars, log, limits)
    elif options.executor == "ray":
        ray_cluster.run_ray(specs, on_done, address=options.address, cpus_per_trial=options.trial_threads(),
                          gpus_per_trial=1 if any(ts.device.startswith("cuda") for ts in specs) else 0,
                          log=log)
    elif options.vectorise_seeds == "on" and options.jobs > 1 and len(specs) > 1:
        pool.run_process_pool(specs, options.jobs, on_done, threads=options.trial_threads(), bars=bars,
                              vectorise=True, capture=options.capture, log=log)
    elif options.vectorise_seeds == "on":
        from .group import run_groups

        run_groups(specs, on_done, bars, log, max_size=MAX_GROUP, capture=options.capture)
    elif options.jobs > 1 and len(specs) > 1:
        pool.run_process_pool(specs, options.jobs, on_done, threads=options.trial_threads(), bars=bars)
    else:
        sequential.run_sequential(specs, on_done, bars)


def run_with_limits(specs: list[TrialSpec], options: Execution, on_done, bars: TrialBars, log, limits=None) -> None:
    """``execute``'s executor under ``--trial-timeout`` / ``--time-budget``: :func:`harness.executors.limits.run_limited`
    (``limits``: a :class:`harness.executors.limits.Limits` whose budget started earlier, else one starting now)."""
    from .executors.limits import Limits, run_limited

    limits = limits or Limits.start(options.trial_timeout, options.time_budget)
    jobs = options.jobs if isinstance(options.jobs, int) else 1
    run_limited(specs, jobs, on_done, limits, threads=options.trial_threads(), bars=bars,
                vectorise=options.vectorise_seeds == "on", capture=options.capture, log=log)


def _terminal_width() -> int:
    """:func:`harness.report.terminal.terminal_width`, imported when a run executes (the report's
    modules import pandas, which ``python -m harness --help`` does not load)."""
    from .report.terminal import terminal_width

    return terminal_width()


def short_reason(reason: str, limit: int = 300) -> str:
    """A trial's reason for its log line: whole when short, else its first part (reasons are joined
    with "; ") and how many more the trial record holds."""
    parts = str(reason).split("; ")
    if len(reason) <= limit or len(parts) == 1:
        return str(reason)
    return f"{parts[0]}; +{len(parts) - 1} more in the trial record"


def trial_line(row: dict, path, n: int, total: int, elapsed_s: float, width: int | None = None) -> str:
    """The log line of one finished trial: status, exact-match, trial time and where it is stored.

    ``width`` (characters; None: no limit): a line longer than that names the trial file from the
    run folder (``trials/<file>``; the run's first line names the folder) and is then wrapped onto
    indented lines of at most ``width`` characters (a long reason, a long variant name)."""
    em = row.get("exact_match")
    em_s = f" exact-match {em:.3f}" if isinstance(em, float) and em == em else ""
    wall = row.get("wall_s")
    wall_s = f" in {wall:.1f} s" if isinstance(wall, float) and wall == wall else ""
    reason = f" ({short_reason(row['reason'])})" if row.get("reason") else ""
    if row.get("resumed_from_step"):
        reason += f" (continued from its checkpoint at step {row['resumed_from_step']})"
    if row.get("checkpoint_note"):
        reason += f" ({row['checkpoint_note']})"
    point = f" [{row['point']}]" if row.get("point") else ""
    head = f"[{n}/{total} {elapsed_s:.0f} s] {row['variant']}{point} seed {row['seed']}: {row['status']}{em_s}{wall_s}"
    line = f"{head}{reason} -> stored in {path}"
    if width is None or len(line) <= width:
        return line
    line = f"{head}{reason} -> stored in {Path(path).parent.name}/{Path(path).name}"
    return textwrap.fill(line, width, subsequent_indent="    ", break_on_hyphens=False)


__all__ = ["Plan", "make_specs", "check_plan_size", "execute", "with_threads", "trial_line",
           "MAX_TRIALS"]


def plan_baseline(req, reg, plan: Plan) -> str | None:
    """The variant a new run (its :class:`harness.request.RunRequest` ``req``) compares the others with, recorded as ``RunMeta.baseline``
    (:func:`harness.report.choose_baseline`): ``--baseline``, an experiment's own, with ``--grid`` the
    grid's variant holding the ``baseline`` variant's components, else ``baseline``, else the one variant that the
    run's variants name as ``Variant.compared_with`` (``gpt`` for ``--variants gpt modern_gpt``); None for a
    measurement.

    Raises:
        ConfigError: an unknown ``--baseline``, or several variants and no way to choose."""
    from .report import choose_baseline

    if plan.measure is not None:
        return None
    preferred = (plan.meta.get("experiment_spec") or {}).get("baseline")
    if req.grid and "baseline" in reg.variants:
        base = reg.variants["baseline"].resolved(reg.defaults or None)
        preferred = next((v.name for v in plan.variants if v.resolved(reg.defaults or None) == base), None)
    names = [v.name for v in plan.variants]
    named = {v.compared_with for v in plan.variants if v.compared_with}
    if preferred is None and "baseline" not in names and len(named) == 1 and named <= set(names):
        preferred = named.pop()
    return choose_baseline(req.baseline, names, preferred)
