"""The report's tables: per-variant statistics across seeds (:func:`aggregate`), the main table
(:func:`summary_table`), its caption, and the smaller tables (variants, sweep, environment).

Definitions of every statistic: :mod:`harness.stats` and ``docs/statistics.md``.
"""
from __future__ import annotations

import json
import math
import re
import numpy as np
import pandas as pd

from .. import stats
from ..config import RunConfig
from ..errors import HarnessError
from ..runmeta import RunMeta
from ..schedule import decay_start, peak_lr
from ..trial import NO_RESULT
from ..metrics import Metric, shown
from .frames import SLOT_COLS, TRAINED, _num, baseline_note, invalid_variants, point_order, resolve_baseline, run_metrics, \
    run_primary, variant_order, verdict_metric
from .rows import SAME_FUNCTION_TEXT, Count, Interval, MeanStd, MedianIQR, SummaryRow, recorded_classes, same_class

# ----------------------------------------------------------------------------- statistics

def paired_values(df: pd.DataFrame, variant: str, baseline: str, point: str, metric: str
                  ) -> tuple[np.ndarray, np.ndarray, list]:
    """(variant values, baseline values, seeds) over the seeds both have at ``point``.

    Trials that raised (status ``failed``) are left out; a diverged trial's value becomes nan
    (the worst score in :func:`harness.stats.prob_improvement`).
    """
    def values(name):
        g = df[(df["variant"] == name) & (df["point"] == point) & (~df["status"].isin(NO_RESULT))]
        v = _num(g, metric).where(g["status"].isin(TRAINED))
        if metric == "steps_to_solve":
            v = v.fillna(np.inf).where(g["status"].isin(TRAINED), np.nan)
        return dict(zip(g["seed"], v))

    a, b = values(variant), values(baseline)
    seeds = sorted(set(a) & set(b))
    return (np.array([a[s] for s in seeds], dtype=float), np.array([b[s] for s in seeds], dtype=float), seeds)


def aggregate(df: pd.DataFrame, baseline: str | None = None, metric: str | None = None,
              meta: RunMeta | None = None, classes: list[list[str]] | None = None,
              metrics: tuple[Metric, ...] | None = None) -> list[SummaryRow]:
    """Per (variant, point) statistics as typed rows (definitions: the module docstring of
    :mod:`harness.report.rows` and ``docs/statistics.md``).

    Args:
        df: :func:`harness.report.trials_frame` of a run.
        baseline: the variant every other is compared with (None: no comparisons).
        metric: the comparison metric, one the task declares for verdicts (None: the task's primary
            metric, :func:`harness.report.frames.run_primary`).
        meta: the run's ``config.json`` (order of variants and points; its check classes; its task).
        classes: check's equivalence classes (default: those ``meta`` recorded under ``check``); a
            variant in the baseline's class is marked :attr:`SummaryRow.same_function`.
        metrics: the task's declared metrics (default :func:`harness.report.frames.run_metrics`).

    Returns:
        One :class:`SummaryRow` per (variant, point) with trials, points outermost, baseline first.

    Raises:
        ConfigError: ``metric`` is not a declared metric verdicts may use.
    """
    metrics = run_metrics(meta) if metrics is None else metrics
    metric = metric or run_primary(meta)
    higher = verdict_metric(metric, metrics).higher_is_better
    if df.empty:
        return []
    classes = recorded_classes(meta) if classes is None else classes
    invalid = invalid_variants(df)
    out = []
    for point in point_order(df, meta):
        for variant in variant_order(df, baseline, meta):
            g = df[(df["variant"] == variant) & (df["point"] == point)]
            if g.empty:
                continue
            comparison = None
            bad, bad_base = invalid.get(variant, []), bool(baseline and invalid.get(baseline))
            if not bad and not bad_base and baseline and variant != baseline and baseline in set(df["variant"]):
                a, b, seeds = paired_values(df, variant, baseline, point, metric)
                if len(seeds):  # never a comparison for a leaking variant nor against a leaking baseline
                    comparison = stats.compare_paired(a, b, higher)
            out.append(_stats_row(g, variant, point, metrics, comparison=comparison, invalid=bad,
                                  baseline_invalid=bad_base, same_function=same_class(classes, variant, baseline)))
    return out


def _stats_row(g: pd.DataFrame, variant: str, point: str, metrics=(), **verdict) -> SummaryRow:
    """The statistics of one (variant, point)'s trials ``g`` across seeds; ``metrics``: the task's
    declarations (those without a :class:`SummaryRow` field get an IQM [CI] in its ``extra``)."""
    status = g["status"] if "status" in g else pd.Series("ok", index=g.index)
    ran, ok = g[~status.isin(NO_RESULT)], g[status.isin(TRAINED)]
    n, n_div = len(ran), int((status == "diverged").sum())
    trained = status[ran.index].isin(TRAINED)
    step_ms = 1000 * _num(ran, "train_s") / _num(ran, "steps").replace(0, np.nan)  # runs stored before step_ms
    if "step_ms" in ran:
        step_ms = _num(ran, "step_ms").fillna(step_ms)  # the trial's own: warm-up steps excluded
    tokens = _num(ran, "tokens_per_s")
    solve = _num(ran, "steps_to_solve").where(trained).fillna(np.inf)
    to_solve = _num(ran, "time_to_solve_s").where(trained).fillna(np.inf).to_numpy()
    first = g.iloc[0]
    return SummaryRow(
        variant=variant, point=point, n=n, n_ok=len(ok), n_failed=int(status.isin(NO_RESULT).sum()),
        params=int(first["params"]) if pd.notna(first.get("params", np.nan)) else None,
        step_ms=float(np.nanmedian(step_ms)) if step_ms.notna().any() else float("nan"),
        tokens_per_s=float(np.nanmedian(tokens)) if tokens.notna().any() else float("nan"),
        early_loss=MeanStd(*stats.mean_std(_num(ran, "early_loss"))),
        heldout_auc=Interval(*stats.iqm_ci(_num(ok, "heldout_auc").to_numpy())),
        heldout_ce=Interval(*stats.iqm_ci(_num(ok, "heldout_ce").to_numpy())),
        exact_match=Interval(*stats.iqm_ci(_num(ok, "exact_match").to_numpy())),
        token_acc=Interval(*stats.iqm_ci(_num(ok, "heldout_token_acc").to_numpy())),
        steps_to_solve=MedianIQR(*(stats.median_iqr(solve.to_numpy()) if n else (float("nan"),) * 3)),
        time_to_solve_s=float(np.median(to_solve)) if n else float("nan"),
        solved=int(np.isfinite(solve).sum()),
        diverged=Count(n_div, n, *stats.wilson_interval(n_div, n)),
        slots={c.removeprefix("slot_"): first.get(c, "") for c in g.columns if c.startswith("slot_")},
        extra={m.name: Interval(*stats.iqm_ci(_num(ok, m.name).to_numpy())) for m in metrics
               if not m.is_core and _num(g, m.name).notna().any()},
        **verdict)


def _fmt_mean_std(ms: MeanStd, digits: int = 3) -> str:
    m, s = ms
    if math.isnan(m):
        return "—"
    return f"{m:.{digits}f}" if math.isnan(s) else f"{m:.{digits}f} ± {s:.{digits}f}"


def _fmt_median_iqr(t: MedianIQR, solved: int, n: int) -> str:
    med, q1, q3 = t
    if math.isnan(med):
        return "—"
    if solved == 0:
        return f"none solved (0/{n})"
    f = stats.fmt_int_or_inf
    if n == 1:  # one seed: no spread to show
        return f"{f(med)} (1/1 solved)"
    return f"{f(med)} [{f(q1)}, {f(q3)}] ({solved}/{n} solved)"


def _fmt_count(t: Count) -> str:
    k, n, lo, hi = t
    if not n:
        return "—"
    if n == 1:  # a Wilson interval from one trial ([0.00, 0.79]) says nothing
        return f"{k}/1"
    return f"{k}/{n} [{lo:.2f}, {hi:.2f}]"


#: The P(> baseline) cell of a variant with one seed paired with the baseline.
ONE_SEED = "1 seed: no interval"


def comparison_cells(r: SummaryRow, baseline: str | None) -> tuple[str, str]:
    """(P(> baseline) cell, verdict cell) of one row of the main table.

    A variant in the baseline's check class (:attr:`SummaryRow.same_function`) shows ``=`` and
    "same function": its paired outcomes are rounding, never a probability or a verdict.
    """
    c = r.comparison
    if r.invalid:
        return "—", "**INVALID** (excluded: see Invalid variants)"
    if r.variant == baseline:
        return "(baseline)", "—"
    if r.baseline_invalid:
        return "—", "no claim (the baseline is invalid)"
    if r.same_function:
        return "= (same function)", f"same function (check: = {baseline}; differences are rounding)"
    if c is None:
        return "—", "no claim: no seed paired with the baseline"
    if c.n_pairs < 2:  # P = 1.00 [0.21, 1.00] from one pair is no figure at all
        return ONE_SEED, c.label()
    p_s = stats.fmt_ci(c.p, c.low, c.high, 2) + f" n={c.n_pairs}"
    return p_s, (c.label().replace("better", "**better**", 1) if c.verdict == "better" else c.label())


def metric_cell(m: Metric, r: SummaryRow) -> str:
    """The main table's cell of metric ``m`` in row ``r``, formatted by its :attr:`harness.metrics.Metric.stat`."""
    v = r.value(m.name)
    if v is None:
        return "—"
    if m.stat == "mean_std":
        return _fmt_mean_std(v)
    if m.stat == "median_iqr":
        return _fmt_median_iqr(v, r.solved, r.n)
    if m.stat == "median":
        return f"{v:.1f}" if math.isfinite(v) else "∞" if v == math.inf else "—"
    return stats.fmt_ci(*v)


def summary_table(df: pd.DataFrame, baseline: str | None = None, metric: str | None = None,
                  meta: RunMeta | None = None, rows: list[SummaryRow] | None = None,
                  metrics: tuple[Metric, ...] | None = None) -> pd.DataFrame:
    """The report's main table as strings, one row per (variant, sweep point), baseline first: the cost
    columns, then one column per metric the task shows in its table (``metrics``, default
    :func:`harness.report.frames.run_metrics`), then divergence and the comparison.

    ``baseline`` defaults to :func:`resolve_baseline`; ``rows`` may pass a precomputed
    :func:`aggregate` result.
    """
    if df.empty:
        return pd.DataFrame()
    metrics = run_metrics(meta) if metrics is None else metrics
    baseline = baseline or resolve_baseline(df, meta)
    rows = rows if rows is not None else aggregate(df, baseline, metric, meta, metrics=metrics)
    has_points = any(r.point for r in rows)
    p_col = f"P(> {baseline}) [95% CI]" if baseline else "P(> baseline)"
    out = []
    for r in rows:
        p_s, v_s = comparison_cells(r, baseline)
        line = {"variant": r.variant}
        if has_points:
            line["point"] = r.point
        line.update({
            "params": r.params if r.params is not None else "—",
            "step ms": f"{r.step_ms:.1f}" if not math.isnan(r.step_ms) else "—",
            "tokens/s": f"{r.tokens_per_s:,.0f}" if not math.isnan(r.tokens_per_s) else "—",
            **{m.header: metric_cell(m, r) for m in shown(metrics, "table")},
            "diverged x/n [Wilson 95%]": _fmt_count(r.diverged),
            p_col: p_s,
            "verdict": v_s,
        })
        out.append(line)
    return pd.DataFrame(out)


#: A cell that reads as one plain number ("0.999", "-12.5", "12,345"): right-aligned as tabulate aligns numbers.
NUMBER_CELL = re.compile(r"^[-+]?(\d{1,3}(,\d{3})+|\d+)?(\.\d+)?([eE][-+]?\d+)?$")


def text_cells(df: pd.DataFrame) -> dict:
    """tabulate options that print the text cells of ``df`` as they are: a column of strings is not
    parsed as numbers (tabulate would print a formatted ``"1.000"`` as ``1`` beside ``0.999``), and
    is right-aligned when every cell is a plain number (:data:`NUMBER_CELL`); other columns (numbers
    kept as numbers) are parsed and aligned by tabulate as before."""
    text, align = [], []
    for i, c in enumerate(df.columns):
        values = [v for v in df[c] if v is not None and not (isinstance(v, float) and math.isnan(v))]
        plain = [v for v in values if not isinstance(v, str)]
        if len(values) == len(df) and not plain:
            text.append(i)
            align.append("right" if all(v and NUMBER_CELL.match(v) for v in values) else "left")
        else:  # tabulate's own rule: a number column when every value is one
            align.append("decimal" if all(isinstance(v, (int, float, np.number)) and not isinstance(v, bool)
                                          or isinstance(v, str) and v and NUMBER_CELL.match(v) for v in values)
                         else "left")
    return {"disable_numparse": text, "colalign": align}


def to_markdown(df: pd.DataFrame) -> str:
    """``df`` as a GitHub markdown table, its text cells printed as they are (:func:`text_cells`):
    each metric column keeps the digits its formatter gave every cell."""
    if df.empty:
        return "_no rows_"
    return df.to_markdown(index=False, tablefmt="github", **text_cells(df))


def environment_block(meta: RunMeta) -> str:
    env = meta.environment
    lines = [f"- {k}: `{v}`" for k, v in env.items() if v is not None]
    lines.append(f"- seeds: `{meta.seeds}`")
    lines.append(f"- dtype: `{meta.dtype or 'fp32'}`")
    ex = meta.execution
    if ex is not None:  # the timing columns depend on it (--jobs auto: trials side by side)
        lines.append(f"- execution: `{ex.executor}, jobs={ex.jobs}, "
                     f"threads per trial={env.get('threads')}`")
    from ..provenance import code_note

    return "\n".join(lines + code_note(meta))


def _read(cfg: dict) -> RunConfig | None:
    """A stored config as this code reads it (an old record's ``lr`` as ``noam_factor``), or None."""
    try:
        return RunConfig.from_dict(cfg)
    except (HarnessError, AttributeError, KeyError, TypeError, ValueError):
        return None


def lr_max(cfg: dict) -> float:
    """Largest learning rate (Adam step size) the schedule reaches in the run
    (:func:`harness.schedule.peak_lr`): for ``noam``, noam_factor * d_model^-0.5 * min(s^-0.5, s *
    warmup^-1.5) at s = min(steps, warmup); for the others their peak. NaN for an unreadable config."""
    run = _read(cfg)
    return float("nan") if run is None else peak_lr(run.train, run.model.d_model)


def recipe_text(cfg: dict) -> str:
    """The training recipe of a config in words, for the report's setup line: optimiser (with its weight
    decay and what it applies to), schedule, its warm-up, learning rate and where it decays to."""
    run = _read(cfg)
    if run is None:
        t = cfg.get("train", {})
        return f"schedule `{t.get('schedule')}`, Noam factor {t.get('noam_factor', t.get('lr'))}"
    t, peak = run.train, f"{peak_lr(run.train, run.model.d_model):.3g}"
    opt = f"optimiser `{t.optimizer}`"
    if t.optimizer == "adamw":
        opt += f" (decoupled weight decay {t.decay():g} on " + \
            ("every parameter)" if t.decay_all else ">= 2-D weights that are not embeddings)")
    if t.schedule == "noam":
        sched = f"warmup {t.warmup}, Noam factor {t.noam_factor:g} -> lr_max = {peak}"
    elif t.schedule == "constant":
        old = "" if t.lr is not None else f" (Noam factor {t.noam_factor:g} * d_model^-0.5)"
        sched = f"no warmup, lr = {peak}{old}"
    else:
        tail = "" if t.schedule != "wsd" else f", stable, then decay over the last {t.steps - decay_start(t)} steps"
        sched = f"warmup {t.warmup} to lr_max = {peak}{tail}, down to min_lr {t.min_lr:g} at step {t.steps}"
    return f"{opt}; schedule `{t.schedule}`, {sched}"


def caption(meta: RunMeta, df: pd.DataFrame, baseline: str | None, metric: str | None,
            metrics: tuple[Metric, ...] | None = None, note: str | None = None) -> str:
    """What every number in the main table means and the budget it was measured with (``metrics``: the
    task's, default :func:`harness.report.frames.run_metrics`; ``metric`` None: its primary metric;
    ``note``: the sentence on the baseline, default :func:`harness.report.frames.baseline_note`)."""
    metrics = run_metrics(meta) if metrics is None else metrics
    metric = metric or run_primary(meta)
    chosen = verdict_metric(metric, metrics)
    cfg = meta.config
    m, t = cfg.get("model", {}), cfg.get("train", {})
    seeds = meta.seeds or sorted(set(df["seed"])) if len(df) else []
    parts = [
        f"{len(seeds)} paired seed(s) per arm ({seeds}): seed i gives every variant the same data order and, "
        f"where the canonical layout is shared, the same initial weights.",
        f"Budget: {t.get('steps')} optimiser steps x {t.get('batch')} sequences (task `{t.get('task')}`, "
        f"train.seq_len {t.get('seq_len')}); {recipe_text(cfg)}; label smoothing {t.get('label_smoothing')}; "
        f"grad clip {t.get('grad_clip') or 'off'}; model N={m.get('N')}, d_model={m.get('d_model')}, h={m.get('h')}, "
        f"d_ff={m.get('d_ff')}, dropout={m.get('dropout')}, V={m.get('vocab')}.",
    ]
    if meta.points:
        parts.append("Sweep points override this config; see the Sweep section.")
    parts += [
        _definitions(metrics),
        f"**P(> {baseline})** compares on **{metric}** ({chosen.text}; {chosen.unit}, {chosen.direction} is better). "
        + stats.RULE_TEXT,
    ]
    note = baseline_note(df, meta, baseline) if note is None else note
    if note:
        parts[-1] = note + " " + parts[-1]
    own = [m for m in shown(metrics, "table") if not m.is_core]
    if own:
        parts.append(own_text(own, df))
    same = same_function_variants(meta, df, baseline)
    if same:
        parts.append(SAME_FUNCTION_TEXT.replace("the baseline's", f"`{baseline}`'s", 1)
                     + f" Here: {', '.join(same)}.")
    return "\n\n".join(parts)


def own_text(own: list[Metric], df: pd.DataFrame) -> str:
    """The caption's paragraph on the metrics a task declares beyond the shared ones (``g2p``: WER, PER):
    each one's text, unit and direction; for a task that decodes freely (a ``decoding`` column), how."""
    parts = [f"**{m.name.upper() if len(m.name) <= 3 else m.name}** ({m.text}; {m.unit}, {m.direction} is better)"
             for m in own]
    text = " and ".join(parts) + ": IQM over the seeds with a 95 % stratified-bootstrap CI."
    if "decoding" in df:
        dec = sorted(set(df["decoding"].dropna().astype(str)))
        text += (" Free-running decoding: the decoder is fed only its own predictions, so no target token can "
                 f"leak: **{', '.join(dec) or 'greedy'}** (`train.beam`; 1 = greedy). For this task "
                 "**exact-match** = 1 - WER (the same decoding).")
    return text


#: The caption's definition of each shared column, by metric (shown when the task's table shows the metric).
DEFINITIONS = {
    "time_to_solve_s": "**time to EM≥0.99 s**: training seconds (evaluation excluded) until the first dev-set "
                       "evaluation with exact-match >= 0.99, median over seeds (∞ when at least half never got "
                       "there); timings depend on the machine and on `--jobs` (see the Environment's execution "
                       "line).",
    "early_loss": "**early loss**: mean ± std over seeds of the mean training loss of the first 10 steps "
                  "(Narang et al. 2021).",
    "heldout_ce": "**held-out CE** (unsmoothed, nats/token) and **exact-match** (greedy decoding, fraction of "
                  "test sequences reproduced exactly) on the test set, both from prefix-only forwards (no logit "
                  "comes from an input holding a later target token, so a leak cannot score; for a causal decoder "
                  "they equal the teacher-forced CE and greedy decoding): IQM over the seeds that finished, with a "
                  "95 % stratified-bootstrap CI (Agarwal et al. 2021).",
    "steps_to_solve": "**steps to EM≥0.99**: first evaluation with dev exact-match >= 0.99, median [IQR] over "
                      "seeds; unsolved and diverged runs count as ∞.",
}
#: The held-out CE's definition for a task whose table has no exact-match (``text``).
CE_ONLY = ("**held-out CE** (unsmoothed, nats/token) on the test set, from prefix-only forwards (no logit comes "
           "from an input holding a later target token, so a leak cannot score; for a causal decoder it equals the "
           "teacher-forced CE): IQM over the seeds that finished, with a 95 % stratified-bootstrap CI (Agarwal et "
           "al. 2021).")


def _definitions(metrics: tuple[Metric, ...]) -> str:
    """The caption's paragraph defining the cost columns and the shared metric columns the table shows."""
    names = {m.name for m in shown(metrics, "table")}
    return " ".join(
        ["**params**: unique parameters (tied weights counted once). **step ms**: median wall time of one "
         "optimiser step (evaluation and the first 10 warm-up steps excluded). **tokens/s**: label tokens per "
         "second of training, warm-up steps excluded (median over seeds)."]
        + [CE_ONLY if name == "heldout_ce" and "exact_match" not in names else text
           for name, text in DEFINITIONS.items() if name in names]
        + ["**diverged**: runs stopped by a non-finite loss or gradient norm, x/n with a Wilson 95 % interval."])


def same_function_variants(meta: RunMeta, df: pd.DataFrame, baseline: str | None) -> list[str]:
    """The run's variants that the recorded check puts in ``baseline``'s class (the baseline excluded)."""
    classes = recorded_classes(meta)
    names = list(dict.fromkeys(df["variant"])) if len(df) else []
    return [v for v in names if same_class(classes, v, baseline)]


def variants_table(df: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    """variant -> its slot assignment (the slots any variant in the run changes) and params."""
    rows = []
    slot_cols = [c for c in df.columns if c.startswith("slot_")]
    varying = [c for c in slot_cols if df[c].nunique(dropna=True) > 1] or SLOT_COLS
    for v in order:
        first = df[df["variant"] == v].iloc[0]
        rows.append({"variant": v, **{c.removeprefix("slot_"): first.get(c, "") for c in varying if c in df},
                     "params": int(first["params"]) if pd.notna(first.get("params", np.nan)) else "—"})
    return pd.DataFrame(rows)


def sweep_table(points: dict[str, dict]) -> pd.DataFrame:
    """One row per sweep point: the dotted config keys that vary across points, and lr_max."""
    keys = []
    for section in ("model", "train", "task"):
        names = {k for cfg in points.values() for k in (cfg.get(section) or {})}
        for k in sorted(names):
            if len({json.dumps((cfg.get(section) or {}).get(k)) for cfg in points.values()}) > 1:
                keys.append((section, k))
    return pd.DataFrame([{"point": name, **{f"{s}.{k}": (cfg.get(s) or {}).get(k) for s, k in keys},
                          "lr_max": f"{lr_max(cfg):.3g}"} for name, cfg in points.items()])

