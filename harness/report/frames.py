"""Loading a stored run into pandas and ordering it: trial and curve frames, variant and point order.

:func:`run_metrics` gives the metrics a run's task declares (:class:`harness.metrics.Metric`), and
:func:`run_primary` the one its verdicts use by default; :data:`METRICS` names those of the built-in tasks;
:data:`TRAINED` the trial statuses that trained to the end. Nothing here knows about experiments or commands.
"""
from __future__ import annotations

import functools
import json
import re

import numpy as np
import pandas as pd

from ..errors import ConfigError, HarnessError
from ..metrics import BUILTIN, COPY_METRICS, COPY_PRIMARY, Metric, by_name
from ..runmeta import RunMeta
from ..slots import slot_columns

from ..store import RunStore

#: The main slots' trial-table columns (``slot_norm`` ...), from the slots' declarations (``Slot.main``).
SLOT_COLS = slot_columns()

#: metric -> (higher is better, label with unit): the metrics built-in tasks' verdicts may use, from their
#: declarations (:data:`harness.metrics.BUILTIN`). A run's own: :func:`run_metrics` (a plugin task's included).
METRICS: dict[str, tuple[bool, str]] = {m.name: (m.higher_is_better, m.label) for m in BUILTIN.values() if m.verdict}
#: The base task's primary metric (:attr:`harness.tasks.base.Task.primary_metric`); a run's: :func:`run_primary`.
DEFAULT_METRIC = COPY_PRIMARY

#: Statuses of trials that trained to the end: ``invalid`` trials (a failed integrity probe, see
#: :func:`harness.checks.properties.trial_rows.integrity_reasons`) keep their numbers in the tables but never get a verdict.
TRAINED = ("ok", "invalid")


def invalid_variants(df: pd.DataFrame) -> dict[str, list[str]]:
    """variant -> the distinct reasons its trials were marked ``invalid`` (first reason of each trial; two
    reasons that differ only in their numbers, such as the size of a leak, count as one: the first seen)."""
    if df.empty or "status" not in df:
        return {}
    out: dict[str, list[str]] = {}
    seen: dict[str, set[str]] = {}
    for r in df[df["status"] == "invalid"].itertuples():
        reason = str(getattr(r, "reason", "") or "")
        first = reason.split("; ")[0]
        shape = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "#", first)
        if shape not in seen.setdefault(r.variant, set()):
            seen[r.variant].add(shape)
            out.setdefault(r.variant, []).append(first)
    return out


# ----------------------------------------------------------------------------- loading

def trials_frame(store: RunStore) -> pd.DataFrame:
    """One row per stored trial (the ``row`` dicts), ``point`` filled with "" when absent."""
    rows = [{k: v for k, v in t.row.items() if k != "traceback"} for t in store.load_trials()]
    df = pd.DataFrame(rows)
    if len(df) and "point" not in df.columns:
        df["point"] = ""
    if len(df):
        df["point"] = df["point"].fillna("")
    return df


def curves_frame(store: RunStore) -> pd.DataFrame:
    """Every curve row of every trial with its variant, seed and point."""
    return pd.DataFrame([{"variant": t.row["variant"], "seed": t.row["seed"], "point": t.row.get("point", "") or "", **c}
                         for t in store.load_trials() for c in t.curve])


def _num(df: pd.DataFrame, col: str) -> pd.Series:
    if col not in df:
        return pd.Series(np.nan, index=df.index, dtype=float)
    return pd.to_numeric(df[col], errors="coerce")


def variant_order(df: pd.DataFrame, baseline: str | None, meta: RunMeta | None = None) -> list[str]:
    """Baseline first, then the run's variant order (name order), then anything else."""
    present = list(dict.fromkeys(df["variant"])) if len(df) else []
    order = [v for v in (meta.variants if meta else []) if v in present]
    order += sorted(v for v in present if v not in order)
    if baseline in order:
        order.remove(baseline)
        order.insert(0, baseline)
    return order


def point_order(df: pd.DataFrame, meta: RunMeta | None = None) -> list[str]:
    """Sweep points in plan order (``config.json`` ``points``), "" (no sweep) first."""
    present = list(dict.fromkeys(df["point"])) if len(df) else [""]
    planned = list(meta.points or {}) if meta else []
    order = [p for p in planned if p in present]
    order += [p for p in present if p not in order]
    return order


def resolve_baseline(df: pd.DataFrame, meta: RunMeta | None = None, baseline: str | None = None) -> str | None:
    """The variant every other is compared with.

    In this order: ``baseline`` when given (an experiment's, ``report --baseline``); the run's recorded
    choice (``RunMeta.baseline``, :func:`choose_baseline`); ``baseline`` when the run has that
    variant; else, for a run stored before the choice was recorded, its first variant
    (:func:`baseline_note` says so in the report). A given or recorded baseline with no trials in
    ``df`` yet gives None (no comparisons).
    """
    present = set(df["variant"]) if len(df) else set()
    for chosen in (baseline, meta.baseline if meta else None):
        if chosen:
            return chosen if not len(df) or chosen in present else None
    if not len(df):
        return None
    if "baseline" in present:
        return "baseline"
    order = variant_order(df, None, meta)
    return order[0] if order else None


def baseline_note(df: pd.DataFrame, meta: RunMeta | None, baseline: str | None, requested: str | None = None) -> str:
    """The report's sentence on the baseline: which variant, and why it was chosen ("" without comparisons).

    ``requested``: the one the report was asked for (``report --baseline``, an experiment's). A run
    stored before the choice was recorded (no ``baseline`` in ``config.json``, no ``baseline``
    variant) keeps its first variant as baseline and the sentence says how to choose another."""
    variants = set(df["variant"]) if len(df) else set()
    if not baseline or len(variants) < 2:
        return ""
    recorded = meta.baseline if meta else None
    if recorded == baseline:
        return f"Baseline: `{baseline}` (the run's choice, recorded in `config.json`)."
    if not requested and recorded is None and baseline != "baseline":
        return (f"Baseline: `{baseline}`, the run's first variant: this run recorded no baseline and has no "
                "`baseline` variant; choose another with `python -m harness report RUN --baseline NAME`.")
    return f"Baseline: `{baseline}`."


def choose_baseline(requested: str | None, variants: list[str], preferred: str | None = None) -> str | None:
    """The baseline a new run records (``RunMeta.baseline``): ``requested`` (``--baseline``), else
    ``preferred`` (an experiment's, or the grid's variant with the ``baseline`` variant's components),
    else ``baseline`` when the run has it, else the only variant; None for no variants.

    Raises:
        ConfigError: ``requested`` is not one of ``variants``, or several variants and none of the
            above: the message says to choose with ``--baseline`` and lists them.
    """
    listed = ", ".join(variants[:12]) + (f", ... ({len(variants)} in all)" if len(variants) > 12 else "")
    if requested is not None:
        if requested not in variants:
            raise ConfigError(f"--baseline {requested!r} is not a variant of this run (variants: {listed})")
        return requested
    for name in (preferred, "baseline"):
        if name and name in variants:
            return name
    if len(variants) < 2:
        return variants[0] if variants else None
    raise ConfigError(f"this run has no 'baseline' variant: name the variant the others are compared with, "
                      f"--baseline NAME (variants: {listed})")


# ----------------------------------------------------------------------------- the run's metrics

@functools.lru_cache(maxsize=16)
def _task_metrics(plugins: str, task: str) -> tuple[tuple[Metric, ...], str]:
    from ..plugins import PluginSpec
    from ..registry import Registry

    spec = PluginSpec.from_dict({**json.loads(plugins), "strict": False})
    t = Registry.from_plugins(spec).task(task)
    return tuple(t.metrics), t.primary_metric


def _declared(meta: RunMeta | None) -> tuple[tuple[Metric, ...], str]:
    if meta is None:  # no run: the base task's (no registry to load)
        return COPY_METRICS, COPY_PRIMARY
    task = (meta.config.get("train") or {}).get("task") or "copy"
    try:
        return _task_metrics(json.dumps(meta.plugins or {}, sort_keys=True), task)
    except (HarnessError, ImportError, OSError, TypeError, ValueError):  # the task's plugin is gone
        return COPY_METRICS, COPY_PRIMARY


def run_metrics(meta: RunMeta | None) -> tuple[Metric, ...]:
    """The metrics the run's task declares (:attr:`harness.tasks.base.Task.metrics`, found by ``train.task``
    with the plugins ``config.json`` recorded); the base task's (:data:`harness.metrics.COPY_METRICS`) without a
    run or when the task's plugin can no longer be loaded."""
    return _declared(meta)[0]


def run_primary(meta: RunMeta | None) -> str:
    """The name of the metric the run's verdicts use by default (:attr:`harness.tasks.base.Task.primary_metric`:
    ``heldout_ce``, ``wer`` for ``g2p``)."""
    return _declared(meta)[1]


def verdict_metric(name: str | None, metrics, what: str = "--metric") -> Metric:
    """The declared metric called ``name`` that verdicts may use.

    Raises:
        ConfigError: ``name`` is not among ``metrics`` (those verdicts may use), the message lists them.
    """
    usable = {k: m for k, m in by_name(metrics).items() if m.verdict}
    if name not in usable:
        raise ConfigError(f"unknown metric {name!r} for {what}; expected one of {', '.join(usable)} "
                          f"(the metrics the run's task declares that verdicts may use)")
    return usable[name]
