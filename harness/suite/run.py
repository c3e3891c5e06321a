"""Running a suite (see :mod:`harness.suite`): one ordinary run per task (:func:`run_tasks`), the
verdicts collected into one frame (:func:`collect`), the suite folder and its report
(:func:`run_suite`, :func:`write_suite_report`)."""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import pandas as pd

from ..errors import ConfigError, StoreError
from ..overview import check_classes
from ..report import training_classes
from ..request import RunOutcome, RunRequest
from ..runmeta import RunMeta
from ..store import RunStore, atomic_write_text
from ..trial import OLD_COLUMNS
from . import report as suite_report
from .spec import SUITE_METRICS, SuiteSpec

SUITE_FILE = "suite.json"


# ------------------------------------------------------------------------------------- running

def task_request(spec: SuiteSpec, task: str, suite_dir: Path, base: RunRequest, resume: bool) -> RunRequest:
    """The run request of one task of the suite (a resumed one when its folder exists): ``base``'s
    plugins, device, dtype and execution with the suite file's variants, preset, seeds and overrides."""
    common = dict(plugins=base.plugins, device=base.device, dtype=base.dtype, executor=base.executor,
                  jobs=base.jobs, threads=base.threads, address=base.address, quiet=base.quiet,
                  vectorise_seeds=base.vectorise_seeds, capture=base.capture)
    if resume:
        return RunRequest(resume=str(suite_dir / task), **common)
    return RunRequest(variants=tuple(spec.variants), preset=spec.preset, seeds=spec.seeds,
                      overrides=(*spec.overrides, f"train.task={task!r}"), results_dir=str(suite_dir), run_id=task,
                      check=False, baseline=spec.reference, lr_grid=tuple(spec.lr_grid) or None,
                      **common)  # the suite checked once


def suite_configs(spec: SuiteSpec, registry) -> list:
    """``(model config, task rows)`` at each distinct model config the suite's tasks train
    (:func:`harness.launch.check_configs` over one plan per task), for the suite's one check."""
    from ..planning import resolve_config
    from ..overview import check_configs
    from ..runner import Plan

    points = [("", resolve_config(spec.preset, [*spec.overrides, f"train.task={task!r}"], registry))
              for task in spec.tasks]
    return check_configs(registry, Plan([], [0], points))


def run_tasks(spec: SuiteSpec, suite_dir: Path, base: RunRequest, on_task: Callable[[RunOutcome], int],
              log: Callable[[str], None]) -> dict[str, int]:
    """Run every task of ``spec`` (:func:`harness.launch.start_run` with :func:`task_request`);
    ``on_task(outcome)`` shows each task's outcome and returns its exit code.

    A task whose folder holds a finished run is not run again; one with a partial run is resumed.
    Returns: task -> exit code (0 ok, 1 some trial failed/diverged/invalid, 2 bad input, 130
    interrupted; the suite stops at 2 and 130 and keeps what finished).
    """
    from ..errors import HarnessError
    from ..launch import start_run

    codes: dict[str, int] = {}
    for i, task in enumerate(spec.tasks, 1):
        folder = suite_dir / task
        meta = _read_meta(folder)
        if meta is not None and meta.status == "complete":
            log(f"suite: task {i}/{len(spec.tasks)} {task}: already complete, kept")
            codes[task] = 0 if (task_frame(folder)["status"] == "ok").all() else 1
            continue
        log(f"suite: task {i}/{len(spec.tasks)} {task}: {spec.seeds} seed(s), preset {spec.preset}")
        try:
            codes[task] = on_task(start_run(task_request(spec, task, suite_dir, base, meta is not None)))
        except HarnessError as exc:
            log(f"harness: error: {exc}")
            codes[task] = exc.exit_code
        if codes[task] in (2, 130):
            break
    return codes


def _read_meta(folder: Path) -> RunMeta | None:
    """The ``config.json`` of the task run in ``folder``; None when there is none or it cannot be read."""
    try:
        return RunStore.open(folder).meta()
    except StoreError:
        return None


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


# ------------------------------------------------------------------------------------ collecting

def task_frame(folder: Path) -> pd.DataFrame:
    """The stored trials of one task run (``trials.csv``), ``point`` as "" when absent."""
    try:
        df = pd.read_csv(folder / "trials.csv", keep_default_na=True, dtype={"point": object})  # "" reads as NaN
    except pd.errors.EmptyDataError:  # a task interrupted before its first trial was stored
        return pd.DataFrame()
    df["point"] = df["point"].fillna("") if "point" in df else ""
    return df.rename(columns=OLD_COLUMNS)


def _slots(df: pd.DataFrame, variant: str) -> dict[str, str]:
    g = df[df["variant"] == variant]
    return {c.removeprefix("slot_"): str(g.iloc[0][c]) for c in df.columns if c.startswith("slot_")} if len(g) else {}


def changed_slots(df: pd.DataFrame, variant: str, reference: str) -> list[str]:
    """``["norm=pre", ...]``: the slots where ``variant`` differs from ``reference``."""
    a, b = _slots(df, variant), _slots(df, reference)
    return [f"{k}={v}" for k, v in sorted(a.items()) if b.get(k) != v]


def collect(spec: SuiteSpec, suite_dir: Path, classes: list[list[str]]) -> pd.DataFrame:
    """One row per (task, variant): the metric's IQM [CI], exact match, the paired comparison with the
    reference and its check relation. Tasks with no stored trials are skipped.

    A variant in the reference's check class (``classes``) gets the verdict "same function" (its
    paired outcomes are rounding); ``test_verdict`` keeps what the sign test alone says for every
    compared row, the negative control's raw material (:func:`harness.suite.report.negative_control`).
    """
    from ..report import aggregate

    rows = []
    for task in spec.tasks:
        folder = suite_dir / task
        if not (folder / "trials.csv").is_file():
            continue
        df, meta = task_frame(folder), _read_meta(folder)
        if df.empty:
            continue
        df, chosen = tuned_trials(df, meta, spec)
        for r in aggregate(df, spec.reference, spec.metric, meta, classes=classes):
            rows.append({**_row(spec, task, df, r), "lr": chosen.get(r.variant, math.nan)})
    return pd.DataFrame(rows)


def tuned_trials(df: pd.DataFrame, meta, spec: SuiteSpec) -> tuple[pd.DataFrame, dict[str, float]]:
    """A task run's trials as its verdicts read them: for a learning-rate sweep each variant's trials at
    its chosen learning rate (:mod:`harness.report.tuning`), with ``{variant: chosen lr}``; else as stored."""
    from ..report.tuning import choose_lrs, dev_column, swept_lrs, tuned_frame

    lrs = swept_lrs(meta)
    column = dev_column(spec.metric, df) if lrs else None
    if column is None:
        return df, {}
    chosen = choose_lrs(df, lrs, column, SUITE_METRICS[spec.metric])
    return tuned_frame(df, chosen), {v: c["lr"] for v, c in chosen.items()}


def _row(spec: SuiteSpec, task: str, df: pd.DataFrame, r) -> dict:
    """The suite frame's row of one :class:`harness.report.SummaryRow` (``suite.csv``'s columns)."""
    v, cmp = r.variant, r.comparison
    relation = ("reference" if v == spec.reference else
                "check: same function" if r.same_function else "check: different")
    ce, em = r.heldout_ce, r.exact_match
    out = {"task": task, "variant": v, "relation": relation, "n": r.n, "n_ok": r.n_ok,
           "invalid": "; ".join(r.invalid), "changed": ", ".join(changed_slots(df, v, spec.reference)),
           "ce": ce.value, "ce_low": ce.low, "ce_high": ce.high, "em": em.value, "em_low": em.low,
           "em_high": em.high, "auc": r.heldout_auc.value, "wer": r.wer.value if r.wer else math.nan,
           "per": r.per.value if r.per else math.nan, "verdict": "", "reason": "", "p": math.nan,
           "p_low": math.nan, "p_high": math.nan, "wins": 0, "losses": 0, "ties": 0, "test_verdict": ""}
    if r.invalid:
        out["verdict"] = "INVALID"
    elif cmp is not None:
        out.update(verdict=r.verdict, reason=cmp.reason, p=cmp.p, p_low=cmp.low, p_high=cmp.high,
                   wins=cmp.wins, losses=cmp.losses, ties=cmp.ties, test_verdict=cmp.verdict)
    return out


# ------------------------------------------------------------------------------------- the suite

def suite_folder(spec: SuiteSpec, results_dir: str, run_id: str | None, resume: str | None) -> Path:
    """The suite's folder: ``resume`` (must hold a suite.json of the same suite), or a new
    ``results_dir/run_id`` (default ``suite-NAME-<timestamp>``).

    Raises:
        ConfigError: resuming a folder that is not a suite of that name; a new folder that exists.
    """
    if resume:
        folder = Path(resume)
        stored = _read_json(folder / SUITE_FILE)
        if stored.get("spec", {}).get("name") != spec.name:
            raise ConfigError(f"{folder} is not a stored run of suite {spec.name!r} (no matching {SUITE_FILE}); "
                              f"resume it with the suite it was made with")
        return folder
    folder = Path(results_dir) / (run_id or f"suite-{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    if folder.exists():
        raise ConfigError(f"{folder} exists; pick another --run-id or continue it with --resume {folder}")
    return folder


def run_suite(spec: SuiteSpec, folder: Path, registry, variants, base: RunRequest, *,
              on_task: Callable[[RunOutcome], int] = lambda outcome: outcome.exit_code,
              log: Callable[[str], None] = lambda line: None) -> int:
    """Check, train every task, write the report. Returns the worst task exit code (0 all trials ok;
    1 a trial failed, diverged or is invalid; 2 bad input; 130 interrupted).

    Raises:
        ConfigError: the reference variant is not among ``variants``; a task that does not declare the
            suite's metric for verdicts (``Task.metrics``); a bad environment switch
            (:func:`harness.planning.check_switches`), found before anything trains.
    """
    names = [v.name for v in variants]
    if spec.reference not in names:
        raise ConfigError(f"suite {spec.name}: reference {spec.reference!r} is not among its variants "
                          f"({', '.join(names)})")
    for task in spec.tasks:
        if spec.metric not in [m.name for m in registry.task(task).metrics if m.verdict]:
            raise ConfigError(f"suite {spec.name}: task {task!r} does not declare the metric {spec.metric!r} "
                              f"(its metrics: {', '.join(m.name for m in registry.task(task).metrics if m.verdict)})")
    from ..planning import check_switches

    check_switches()  # a mistyped HARNESS_* switch: bad input before the suite's folder and check
    folder.mkdir(parents=True, exist_ok=True)
    info = _read_json(folder / SUITE_FILE) or {"spec": asdict(spec), "wall_s": 0.0, "command": base.command_line()}
    t0 = time.perf_counter()
    if not info.get("check"):
        log(f"suite {spec.name}: check on {len(names)} variant(s) ...")
        info["check"] = check_classes(registry, variants, full=True, configs=suite_configs(spec, registry))
        _write_json(folder / SUITE_FILE, info)
    try:
        codes = run_tasks(spec, folder, base, on_task, log)
    finally:
        info["wall_s"] = info.get("wall_s", 0.0) + time.perf_counter() - t0
        _write_json(folder / SUITE_FILE, info)
    info["codes"] = {**info.get("codes", {}), **codes}
    _write_json(folder / SUITE_FILE, info)
    path = write_suite_report(folder, spec, info)
    log(f"suite report: {path}  ({info['wall_s']:.0f} s)")
    return max(codes.values(), key=lambda c: {0: 0, 1: 1, 2: 2, 130: 3}.get(c, 1), default=0)


def _write_json(path: Path, data: dict) -> None:
    atomic_write_text(path, json.dumps(data, indent=1, default=str))


def write_suite_report(folder: Path, spec: SuiteSpec, info: dict) -> Path:
    """Write ``suite.md``, ``suite.csv`` and ``suite_verdicts.png`` into ``folder``; returns suite.md."""
    df = collect(spec, folder, training_classes(info.get("check")))
    env_meta = next((m for t in spec.tasks if (m := _read_meta(folder / t)) is not None), None)
    if len(df):
        atomic_write_text(folder / "suite.csv", df.to_csv(index=False))
        suite_report.plot_verdicts(df, spec, folder / "suite_verdicts.png")
    path = folder / "suite.md"
    atomic_write_text(path, suite_report.render(df, spec, info, env_meta))
    return path
