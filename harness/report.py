"""Reports: per-variant statistics across seeds, pandas tables via tabulate, matplotlib plots.

:func:`aggregate` computes, per variant (and sweep point), the statistics the report shows
(definitions in :mod:`harness.stats` and ``docs/statistics.md``); :func:`summary_table`
formats them; :func:`write_report` renders ``report.md`` with its PNG figures from what a run
stored, so ``python -m harness report RUN`` can re-render it at any time. Experiments add
their own sections through :func:`harness.experiments.report_sections`.

Main table columns (one row per variant x sweep point, the baseline first, as Narang et al.
2021 Table 1): params; step time (median ms per optimiser step, evaluation excluded); early
loss (mean ± std of the mean training loss over the first 10 steps); final held-out
cross-entropy and exact-match (IQM [95 % stratified-bootstrap CI] over the runs that finished);
steps to exact-match >= 0.99 (median [IQR], unsolved and diverged runs count as ∞);
diverged x/n [Wilson 95 %]; P(variant > baseline) [95 % Wilson score interval] over paired
seeds on the comparison metric; the verdict with the test and numbers behind it
(:data:`harness.stats.RULE_TEXT`).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from . import stats
from .store import RunStore, atomic_write_text

SLOT_COLS = ["slot_norm", "slot_embedding", "slot_attention", "slot_mask"]

#: metric -> (higher is better, label with unit). Metrics a report or compare can use.
METRICS: dict[str, tuple[bool, str]] = {
    "heldout_ce": (False, "held-out cross-entropy (nats/token, unsmoothed)"),
    "exact_match": (True, "held-out exact-match (fraction of sequences)"),
    "heldout_token_acc": (True, "held-out token accuracy (teacher forcing)"),
    "final_train_loss": (False, "final training loss (label-smoothed, nats/token)"),
    "early_loss": (False, "early training loss (mean of the first 10 steps)"),
    "steps_to_solve": (False, "steps to held-out exact-match >= 0.99"),
}
DEFAULT_METRIC = "heldout_ce"

#: Statuses of trials that trained to the end: ``invalid`` trials (a failed integrity probe, see
#: :func:`harness.probes.integrity_reasons`) keep their numbers in the tables but never get a verdict.
TRAINED = ("ok", "invalid")


def invalid_variants(df: pd.DataFrame) -> dict[str, list[str]]:
    """variant -> the distinct reasons its trials were marked ``invalid`` (first reason of each trial)."""
    if df.empty or "status" not in df:
        return {}
    out: dict[str, list[str]] = {}
    for r in df[df["status"] == "invalid"].itertuples():
        reason = str(getattr(r, "reason", "") or "")
        first = reason.split("; ")[0]
        lst = out.setdefault(r.variant, [])
        if first not in lst:
            lst.append(first)
    return out


def invalid_section(df: pd.DataFrame) -> list[str]:
    """The report's opening "Invalid variants" section (empty list when there are none)."""
    bad = invalid_variants(df)
    if not bad:
        return []
    lines = ["## Invalid variants", "",
             "These variants use a component that breaks its slot's contract (docs/components.md) or failed an "
             "integrity probe (a decoder that sees the future, a padding mask that does not hold, non-finite "
             "gradients) at initialisation or after training. Their numbers are shown "
             "below so you can see what the leak buys, but they are excluded from every verdict, ranking and "
             "P(A > B). Diagnose the component with `python -m harness check --variants NAME`.", ""]
    for variant, reasons in bad.items():
        g = df[(df["variant"] == variant) & (df["status"] == "invalid")]
        seeds = ", ".join(str(s) for s in sorted(set(g["seed"])))
        lines.append(f"- **{variant}** (seeds {seeds}): " + "; ".join(reasons[:3]))
    return lines + [""]


# ----------------------------------------------------------------------------- loading

def trials_frame(store: RunStore) -> pd.DataFrame:
    """One row per stored trial (the ``row`` dicts), ``point`` filled with "" when absent."""
    rows = [{k: v for k, v in t["row"].items() if k != "traceback"} for t in store.load_trials()]
    df = pd.DataFrame(rows)
    if len(df) and "point" not in df.columns:
        df["point"] = ""
    if len(df):
        df["point"] = df["point"].fillna("")
    return df


def curves_frame(store: RunStore) -> pd.DataFrame:
    """Every curve row of every trial with its variant, seed and point."""
    return pd.DataFrame([{"variant": t["row"]["variant"], "seed": t["row"]["seed"],
                          "point": t["row"].get("point", "") or "", **c}
                         for t in store.load_trials() for c in t.get("curve", [])])


def _num(df: pd.DataFrame, col: str) -> pd.Series:
    if col not in df:
        return pd.Series(np.nan, index=df.index, dtype=float)
    return pd.to_numeric(df[col], errors="coerce")


def variant_order(df: pd.DataFrame, baseline: str | None, meta: dict | None = None) -> list[str]:
    """Baseline first, then the run's variant order (name order), then anything else."""
    present = list(dict.fromkeys(df["variant"])) if len(df) else []
    order = [v for v in (meta or {}).get("variants", []) if v in present]
    order += sorted(v for v in present if v not in order)
    if baseline in order:
        order.remove(baseline)
        order.insert(0, baseline)
    return order


def point_order(df: pd.DataFrame, meta: dict | None = None) -> list[str]:
    """Sweep points in plan order (``config.json`` ``points``), "" (no sweep) first."""
    present = list(dict.fromkeys(df["point"])) if len(df) else [""]
    planned = list((meta or {}).get("points", {}) or {})
    order = [p for p in planned if p in present]
    order += [p for p in present if p not in order]
    return order


def resolve_baseline(df: pd.DataFrame, meta: dict | None = None, baseline: str | None = None) -> str | None:
    """The explicit baseline, the experiment's, ``baseline`` when present, else the first variant."""
    if not len(df):
        return baseline
    present = set(df["variant"])
    spec = (meta or {}).get("experiment_spec") or {}
    for cand in (baseline, spec.get("baseline")):
        if cand:
            return cand if cand in present else None
    if "baseline" in present:
        return "baseline"
    order = variant_order(df, None, meta)
    return order[0] if order else None


# ----------------------------------------------------------------------------- statistics

def paired_values(df: pd.DataFrame, variant: str, baseline: str, point: str, metric: str
                  ) -> tuple[np.ndarray, np.ndarray, list]:
    """(variant values, baseline values, seeds) over the seeds both have at ``point``.

    Trials that raised (status ``failed``) are left out; a diverged trial's value becomes nan
    (the worst score in :func:`harness.stats.prob_improvement`).
    """
    def values(name):
        g = df[(df["variant"] == name) & (df["point"] == point) & (df["status"] != "failed")]
        v = _num(g, metric).where(g["status"].isin(TRAINED))
        if metric == "steps_to_solve":
            v = v.fillna(np.inf).where(g["status"].isin(TRAINED), np.nan)
        return dict(zip(g["seed"], v))

    a, b = values(variant), values(baseline)
    seeds = sorted(set(a) & set(b))
    return (np.array([a[s] for s in seeds], dtype=float), np.array([b[s] for s in seeds], dtype=float), seeds)


def aggregate(df: pd.DataFrame, baseline: str | None = None, metric: str = DEFAULT_METRIC,
              meta: dict | None = None) -> list[dict[str, Any]]:
    """Per (variant, point) statistics as numbers (see the module docstring for definitions).

    Raises:
        ValueError: unknown ``metric`` (one of :data:`METRICS`).
    """
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}")
    if df.empty:
        return []
    higher = METRICS[metric][0]
    invalid = invalid_variants(df)
    out = []
    for point in point_order(df, meta):
        for variant in variant_order(df, baseline, meta):
            g = df[(df["variant"] == variant) & (df["point"] == point)]
            if g.empty:
                continue
            status = g["status"] if "status" in g else pd.Series("ok", index=g.index)
            ran = g[status != "failed"]
            ok = g[status.isin(TRAINED)]
            n = len(ran)
            n_div = int((status == "diverged").sum())
            steps = _num(ran, "steps").replace(0, np.nan)
            step_ms = 1000 * _num(ran, "train_s") / steps
            solve = _num(ran, "steps_to_solve").where(ran["status"].isin(TRAINED)).fillna(np.inf)
            first = g.iloc[0]
            row: dict[str, Any] = {
                "variant": variant, "point": point, "n": n, "n_ok": len(ok), "n_failed": int((status == "failed").sum()),
                "params": int(first["params"]) if pd.notna(first.get("params", np.nan)) else None,
                "step_ms": float(np.nanmedian(step_ms)) if step_ms.notna().any() else float("nan"),
                "tokens_per_s": float(np.nanmedian(_num(ran, "tokens_per_s"))) if _num(ran, "tokens_per_s").notna().any() else float("nan"),
                "early_loss": stats.mean_std(_num(ran, "early_loss")),
                "heldout_ce": stats.iqm_ci(_num(ok, "heldout_ce").to_numpy()),
                "exact_match": stats.iqm_ci(_num(ok, "exact_match").to_numpy()),
                "token_acc": stats.iqm_ci(_num(ok, "heldout_token_acc").to_numpy()),
                "steps_to_solve": stats.median_iqr(solve.to_numpy()) if n else (float("nan"),) * 3,
                "time_to_solve_s": float(np.median(_num(ran, "time_to_solve_s").where(ran["status"].isin(TRAINED))
                                                   .fillna(np.inf).to_numpy())) if n else float("nan"),
                "solved": int(np.isfinite(solve).sum()),
                "diverged": (n_div, n, *stats.wilson_interval(n_div, n)),
                "slots": {c.removeprefix("slot_"): first.get(c, "") for c in g.columns if c.startswith("slot_")},
                "comparison": None,
                "invalid": invalid.get(variant, []),
                "baseline_invalid": bool(baseline and invalid.get(baseline)),
            }
            if row["invalid"] or row["baseline_invalid"]:
                pass  # never a comparison for a variant whose masks leak, nor against such a baseline
            elif baseline and variant != baseline and baseline in set(df["variant"]):
                a, b, seeds = paired_values(df, variant, baseline, point, metric)
                if len(seeds):
                    row["comparison"] = stats.compare_paired(a, b, higher)
            out.append(row)
    return out


def _fmt_mean_std(ms: tuple[float, float], digits: int = 3) -> str:
    m, s = ms
    if math.isnan(m):
        return "—"
    return f"{m:.{digits}f}" if math.isnan(s) else f"{m:.{digits}f} ± {s:.{digits}f}"


def _fmt_median_iqr(t: tuple[float, float, float], solved: int, n: int) -> str:
    med, q1, q3 = t
    if math.isnan(med):
        return "—"
    if solved == 0:
        return f"none solved (0/{n})"
    f = stats.fmt_int_or_inf
    return f"{f(med)} [{f(q1)}, {f(q3)}] ({solved}/{n} solved)"


def _fmt_count(t: tuple) -> str:
    k, n, lo, hi = t
    if not n:
        return "—"
    return f"{k}/{n} [{lo:.2f}, {hi:.2f}]"


def summary_table(df: pd.DataFrame, baseline: str | None = None, metric: str = DEFAULT_METRIC,
                  meta: dict | None = None, rows: list[dict] | None = None) -> pd.DataFrame:
    """The report's main table as strings, one row per (variant, sweep point), baseline first.

    ``baseline`` defaults to :func:`resolve_baseline`; ``rows`` may pass a precomputed
    :func:`aggregate` result.
    """
    if df.empty:
        return pd.DataFrame()
    baseline = baseline or resolve_baseline(df, meta)
    rows = rows if rows is not None else aggregate(df, baseline, metric, meta)
    has_points = any(r["point"] for r in rows)
    p_col = f"P(> {baseline}) [95% CI]" if baseline else "P(> baseline)"
    out = []
    for r in rows:
        c = r["comparison"]
        if r.get("invalid"):
            p_s, v_s = "—", "**INVALID** (excluded: see Invalid variants)"
        elif r["variant"] == baseline:
            p_s, v_s = "(baseline)", "—"
        elif r.get("baseline_invalid"):
            p_s, v_s = "—", "no claim (the baseline is invalid)"
        elif c is None:
            p_s, v_s = "—", "no claim: no seed paired with the baseline"
        else:
            p_s = stats.fmt_ci(c.p, c.low, c.high, 2) + f" n={c.n_pairs}"
            v_s = c.label().replace("better", "**better**", 1) if c.verdict == "better" else c.label()
        line = {"variant": r["variant"]}
        if has_points:
            line["point"] = r["point"]
        line.update({
            "params": r["params"] if r["params"] is not None else "—",
            "step ms": f"{r['step_ms']:.1f}" if not math.isnan(r["step_ms"]) else "—",
            "tokens/s": f"{r['tokens_per_s']:,.0f}" if not math.isnan(r["tokens_per_s"]) else "—",
            "time to EM≥0.99 s (median)": (f"{r['time_to_solve_s']:.1f}" if math.isfinite(r["time_to_solve_s"])
                                           else "∞" if r["time_to_solve_s"] == math.inf else "—"),
            "early loss (mean ± std)": _fmt_mean_std(r["early_loss"]),
            "held-out CE IQM [95% CI]": stats.fmt_ci(*r["heldout_ce"]),
            "exact-match IQM [95% CI]": stats.fmt_ci(*r["exact_match"]),
            "steps to EM≥0.99 median [IQR]": _fmt_median_iqr(r["steps_to_solve"], r["solved"], r["n"]),
            "diverged x/n [Wilson 95%]": _fmt_count(r["diverged"]),
            p_col: p_s,
            "verdict": v_s,
        })
        out.append(line)
    return pd.DataFrame(out)


def to_markdown(df: pd.DataFrame) -> str:
    if df.empty:
        return "_no rows_"
    return df.to_markdown(index=False, tablefmt="github")


def environment_block(meta: dict) -> str:
    env = meta.get("environment", {})
    lines = [f"- {k}: `{v}`" for k, v in env.items() if v is not None]
    lines.append(f"- seeds: `{meta.get('seeds')}`")
    lines.append(f"- dtype: `{meta.get('dtype', 'fp32')}`")
    ex = meta.get("execution")
    if isinstance(ex, dict):  # the timing columns depend on it (--jobs auto: trials side by side)
        lines.append(f"- execution: `{ex.get('executor', 'local')}, jobs={ex.get('jobs')}, "
                     f"threads per trial={env.get('threads')}`")
    return "\n".join(lines)


def lr_max(cfg: dict) -> float:
    """Largest learning rate the schedule reaches in the run (Adam step size).

    noam: lr * d_model^-0.5 * min(s^-0.5, s * warmup^-1.5) maximised over s <= steps;
    constant: lr * d_model^-0.5.
    """
    m, t = cfg.get("model", {}), cfg.get("train", {})
    try:
        base = float(t["lr"]) * float(m["d_model"]) ** -0.5
        if t.get("schedule", "noam") == "constant":
            return base
        s = min(int(t["steps"]), int(t["warmup"]))
        return base * min(s ** -0.5, s * int(t["warmup"]) ** -1.5)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return float("nan")


def caption(meta: dict, df: pd.DataFrame, baseline: str | None, metric: str) -> str:
    """What every number in the main table means and the budget it was measured with."""
    cfg = meta.get("config", {})
    m, t = cfg.get("model", {}), cfg.get("train", {})
    seeds = meta.get("seeds") or sorted(set(df["seed"])) if len(df) else []
    parts = [
        f"{len(seeds)} paired seed(s) per arm ({seeds}): seed i gives every variant the same data order and, "
        f"where the canonical layout is shared, the same initial weights.",
        f"Budget: {t.get('steps')} optimiser steps x {t.get('batch')} sequences (task `{t.get('task')}`, "
        f"content length <= {t.get('seq_len')}); schedule `{t.get('schedule')}`, "
        f"{'no warmup' if t.get('schedule') == 'constant' else 'warmup ' + str(t.get('warmup'))}, "
        f"base lr {t.get('lr')} -> lr_max = {lr_max(cfg):.3g}; label smoothing {t.get('label_smoothing')}; "
        f"grad clip {t.get('grad_clip') or 'off'}; model N={m.get('N')}, d_model={m.get('d_model')}, h={m.get('h')}, "
        f"d_ff={m.get('d_ff')}, dropout={m.get('dropout')}, V={m.get('vocab')}.",
    ]
    if meta.get("points"):
        parts.append("Sweep points override this config; see the Sweep section.")
    parts += [
        "**params**: unique parameters (tied weights counted once). **step ms**: median wall time of one "
        "optimiser step (evaluation excluded). **tokens/s**: label tokens per second of training (median over "
        "seeds). **time to EM≥0.99 s**: training seconds (evaluation excluded) until the first evaluation with "
        "exact-match >= 0.99, median over seeds (∞ when at least half never got there); timings depend on "
        "the machine and on `--jobs` (see the Environment's execution line). **early loss**: mean ± std over seeds of the mean training "
        "loss of the first 10 steps (Narang et al. 2021). **held-out CE** (unsmoothed, nats/token) and "
        "**exact-match** (greedy decoding, fraction of held-out sequences reproduced exactly; read off the "
        "teacher-forced pass when the decoder is verified causal, which is the same event): IQM over the "
        "seeds that finished, with a 95 % stratified-bootstrap CI (Agarwal et al. 2021). **steps to "
        "EM≥0.99**: first evaluation with held-out exact-match >= 0.99, median [IQR] over seeds; unsolved "
        "and diverged runs count as ∞. **diverged**: runs stopped by a non-finite loss or gradient norm, "
        "x/n with a Wilson 95 % interval.",
        f"**P(> {baseline})** compares on **{metric}** ({METRICS[metric][1]}; "
        f"{'higher' if METRICS[metric][0] else 'lower'} is better). " + stats.RULE_TEXT,
    ]
    return "\n\n".join(parts)


# ----------------------------------------------------------------------------- plots

def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _scale(ax, values, axis: str = "y") -> str:
    """Log scale when the positive ``values`` span more than a decade, else linear; plain tick labels."""
    v = pd.to_numeric(pd.Series(np.asarray(values, dtype=float).ravel()), errors="coerce")
    v = v[np.isfinite(v) & (v > 0)]
    log = len(v) > 0 and v.max() / v.min() > 10
    if log:
        log_axis(ax, axis)
    else:
        getattr(ax, f"set_{axis}scale")("linear")
    return "log" if log else "linear"


def log_axis(ax, axis: str = "y") -> None:
    """Log scale with ticks at 1, 2, 5 x 10^k labelled as plain numbers (readable on short ranges)."""
    from matplotlib import ticker

    getattr(ax, f"set_{axis}scale")("log")
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    target.set_major_formatter(ticker.FuncFormatter(lambda x, _: f"{x:g}"))
    target.set_minor_locator(ticker.NullLocator())


def _series_label(variant: str, point: str) -> str:
    return f"{variant} @ {point}" if point else variant


def _colors(n: int):
    plt = _plt()
    cmap = plt.get_cmap("tab10" if n <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(n)]


def _series(df: pd.DataFrame, meta: dict | None, baseline: str | None) -> list[tuple[str, str]]:
    return [(v, p) for p in point_order(df, meta) for v in variant_order(df, baseline, meta)
            if ((df["variant"] == v) & (df["point"] == p)).any()]


def plot_curves(curves: pd.DataFrame, path: Path, series: list[tuple[str, str]] | None = None) -> Path | None:
    """Training loss per step, held-out CE and held-out exact-match per evaluation, per
    variant (x sweep point): median over seeds with an interquartile band. Returns the path."""
    if curves.empty or "split" not in curves:
        return None
    plt = _plt()
    if "point" not in curves:
        curves = curves.assign(point="")
    curves = curves.assign(point=curves["point"].fillna(""))
    series = series or list(dict.fromkeys(zip(curves["variant"], curves["point"])))
    if len(series) > MAX_OVERLAID:
        return plot_curves_grid(curves, path, series)
    styles = ["-", "--", ":", "-."]
    variants = list(dict.fromkeys(v for v, _ in series))
    points = list(dict.fromkeys(p for _, p in series))
    if 1 < len(points) <= len(styles):  # colour = variant, line style = sweep point
        vc = dict(zip(variants, _colors(len(variants))))
        look = {(v, p): (vc[v], styles[points.index(p)]) for v, p in series}
    else:
        look = {s: (c, styles[(i // 20) % len(styles)]) for i, (s, c) in enumerate(zip(series, _colors(len(series))))}
    fig, axes = plt.subplots(1, 3, figsize=(16, 5.2))
    from matplotlib import ticker

    for variant, point in series:
        g = curves[(curves["variant"] == variant) & (curves["point"] == point)]
        if g.empty:
            continue
        color, ls = look[(variant, point)]
        label = _series_label(variant, point)
        many = g["seed"].nunique() > 1
        tr = g[g["split"] == "train"].groupby("step")["loss"]
        if len(tr):
            smooth = lambda s: s.rolling(10, min_periods=1).mean()  # noqa: E731
            med = smooth(tr.median())
            axes[0].plot(med.index, med.values, color=color, ls=ls, lw=1.4, label=label)
            if many:
                axes[0].fill_between(med.index, smooth(tr.quantile(0.25)), smooth(tr.quantile(0.75)),
                                     color=color, alpha=0.15, lw=0)
        ho = g[g["split"] == "heldout"]
        for ax, col in ((axes[1], "loss"), (axes[2], "exact_match")):
            if col not in ho or ho[col].isna().all():
                continue
            h = ho.groupby("step")[col]
            med = h.median()
            ax.plot(med.index, med.values, color=color, ls=ls, marker="o", ms=3, lw=1.4, label=label)
            if many:
                ax.fill_between(med.index, h.quantile(0.25), h.quantile(0.75), color=color, alpha=0.15, lw=0)
    sc = _scale(axes[0], curves.loc[curves["split"] == "train", "loss"])
    axes[0].set(xlabel="optimiser step", ylabel=f"training loss, nats/token ({sc} scale)",
                title="Training loss (label-smoothed)\nmedian over seeds, IQR band, 10-step mean")
    sc = _scale(axes[1], curves.loc[curves["split"] == "heldout", "loss"])
    axes[1].set(xlabel="optimiser step", ylabel=f"held-out cross-entropy, nats/token ({sc} scale)",
                title="Held-out cross-entropy (unsmoothed)\nmedian over seeds, IQR band")
    axes[2].set(xlabel="optimiser step", ylabel="held-out exact-match (fraction)", ylim=(-0.02, 1.02),
                title="Held-out exact-match (greedy)\nmedian over seeds, IQR band")
    axes[2].axhline(0.99, color="grey", lw=0.8, ls="--")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    handles, labels = axes[0].get_legend_handles_labels()
    if not handles:
        handles, labels = axes[1].get_legend_handles_labels()
    ncol = min(len(labels), 4) or 1
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=9, frameon=False)
    rows = math.ceil(len(labels) / ncol) if labels else 1
    fig.tight_layout(rect=(0, 0.05 * rows + 0.02, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


MAX_OVERLAID = 6  #: more series than this: one small panel per series instead of overlaid lines


def _smooth(s: pd.Series) -> pd.Series:
    return s.rolling(10, min_periods=1).mean()


def plot_curves_grid(curves: pd.DataFrame, path: Path, series: list[tuple[str, str]]) -> Path:
    """Small multiples for many variants: one panel per variant (x point) with its training loss
    (solid, 10-step mean) and held-out cross-entropy (dashed, markers), median over seeds with
    IQR bands; the first series (the baseline) is repeated in grey in every panel."""
    plt = _plt()
    from matplotlib import ticker

    ncols = 4
    nrows = math.ceil(len(series) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.0 * nrows + 0.8), sharex=True, sharey=True,
                             squeeze=False)
    colors = ["tab:blue"] * len(series)  # one variant per panel: one strong colour reads best

    def medians(g):
        tr = g[g["split"] == "train"].groupby("step")["loss"]
        ho = g[g["split"] == "heldout"].groupby("step")["loss"]
        return tr, ho

    ref_v, ref_p = series[0]
    ref_tr, ref_ho = medians(curves[(curves["variant"] == ref_v) & (curves["point"] == ref_p)])
    for ax, (variant, point), color in zip(axes.ravel(), series, colors):
        g = curves[(curves["variant"] == variant) & (curves["point"] == point)]
        tr, ho = medians(g)
        if (variant, point) != (ref_v, ref_p) and len(ref_tr):
            ax.plot(ref_tr.median().index, _smooth(ref_tr.median()), color="0.6", lw=1, label=f"{ref_v} (reference)")
            ax.plot(ref_ho.median().index, ref_ho.median(), color="0.6", lw=1, ls="--", marker="o", ms=2)
        if len(tr):
            med = _smooth(tr.median())
            ax.plot(med.index, med, color=color, lw=1.6, label="training loss")
            ax.fill_between(med.index, _smooth(tr.quantile(0.25)), _smooth(tr.quantile(0.75)), color=color, alpha=0.2, lw=0)
        if len(ho):
            ax.plot(ho.median().index, ho.median(), color=color, lw=1.6, ls="--", marker="o", ms=3, label="held-out CE")
            ax.fill_between(ho.median().index, ho.quantile(0.25), ho.quantile(0.75), color=color, alpha=0.12, lw=0)
        ax.set_title(_series_label(variant, point), fontsize=10)
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True, nbins=5))
    for ax in axes.ravel()[len(series):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("nats/token")
    for ax in axes[-1, :]:
        ax.set_xlabel("optimiser step")
    handles, labels = axes.ravel()[min(1, len(series) - 1)].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=9, frameon=False)
    fig.suptitle("Training loss (solid, 10-step mean) and held-out cross-entropy (dashed): median over seeds, "
                 "IQR bands; grey: the baseline", fontsize=11)
    fig.tight_layout(rect=(0, 0.04, 1, 0.97))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_final_metrics(df: pd.DataFrame, rows: list[dict], path: Path) -> Path | None:
    """Per variant (x point): held-out CE and exact-match, every seed as a grey dot and the IQM
    with its 95 % bootstrap CI as a coloured bar. Returns the path, or None without data."""
    if not rows:
        return None
    plt = _plt()
    labels = [_series_label(r["variant"], r["point"]) for r in rows]
    colors = _colors(len(rows))
    h = max(2.6, 0.42 * len(rows) + 1.4)
    fig, axes = plt.subplots(1, 2, figsize=(13, h), sharey=True)
    rng = np.random.default_rng(0)
    ce_scale = _scale(axes[0], _num(df[df["status"] == "ok"], "heldout_ce"), "x")
    for ax, key, col, title in ((axes[0], "heldout_ce", "heldout_ce", f"Held-out cross-entropy, nats/token ({ce_scale} scale)"),
                                (axes[1], "exact_match", "exact_match", "Held-out exact-match (fraction)")):
        for i, (r, color) in enumerate(zip(rows, colors)):
            g = df[(df["variant"] == r["variant"]) & (df["point"] == r["point"]) & (df["status"] == "ok")]
            vals = _num(g, col).dropna().to_numpy()
            y = len(rows) - 1 - i
            ax.scatter(vals, y + rng.uniform(-0.18, 0.18, vals.size), s=14, color="0.55", zorder=2)
            point, lo, hi = r[key]
            if not math.isnan(point):
                xerr = None if math.isnan(lo) else [[point - lo], [hi - point]]
                ax.errorbar([point], [y], xerr=xerr, fmt="D", color=color, ms=7, capsize=5, lw=2, zorder=3)
        ax.set_title(title + "\nIQM (diamond) with 95 % bootstrap CI; grey: seeds", fontsize=10)
        ax.grid(alpha=0.3, axis="x")
    axes[1].set_xlim(-0.03, 1.03)
    axes[1].axvline(0.99, color="grey", lw=0.8, ls="--")
    axes[0].set_yticks(range(len(rows)))
    axes[0].set_yticklabels(labels[::-1])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_steps_to_solve(df: pd.DataFrame, rows: list[dict], path: Path, budget: int | None) -> Path | None:
    """Steps to held-out exact-match >= 0.99: every seed as a dot, unsolved runs as x at the
    right edge, the median as a black bar and the IQR as a thick line."""
    if not rows:
        return None
    plt = _plt()
    labels = [_series_label(r["variant"], r["point"]) for r in rows]
    colors = _colors(len(rows))
    finite_all = _num(df, "steps_to_solve").dropna()
    right = float(budget or (finite_all.max() if len(finite_all) else 1))
    edge = right * 1.06
    fig, ax = plt.subplots(figsize=(9, max(2.6, 0.42 * len(rows) + 1.4)))
    rng = np.random.default_rng(1)
    for i, (r, color) in enumerate(zip(rows, colors)):
        y = len(rows) - 1 - i
        g = df[(df["variant"] == r["variant"]) & (df["point"] == r["point"]) & (df["status"] != "failed")]
        s = _num(g, "steps_to_solve").where(g["status"] == "ok")
        solved = s.dropna().to_numpy()
        n_uns = len(g) - solved.size
        ax.scatter(solved, y + rng.uniform(-0.15, 0.15, solved.size), s=18, color=color, zorder=3)
        if n_uns:
            ax.scatter([edge] * n_uns, y + rng.uniform(-0.15, 0.15, n_uns), marker="x", s=30, color=color, zorder=3)
        med, q1, q3 = r["steps_to_solve"]
        clip = lambda v: edge if math.isinf(v) else v  # noqa: E731
        if not math.isnan(med):
            ax.plot([clip(q1), clip(q3)], [y, y], color="black", lw=4, alpha=0.35, zorder=2)
            ax.plot([clip(med)] * 2, [y - 0.3, y + 0.3], color="black", lw=2, zorder=4)
    from matplotlib import ticker

    ax.axvline(right, color="grey", lw=0.8, ls=":")
    ax.set_xlim(0, edge * 1.04)
    ticks = [t for t in ticker.MaxNLocator(nbins=8, integer=True).tick_values(0, right) if 0 <= t <= right * 0.95]
    ticks = ticks + [right] if right not in ticks else ticks
    ax.set_xticks(ticks + [edge])
    ax.set_xticklabels([f"{t:.0f}" for t in ticks] + ["not\nsolved"])
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(labels[::-1])
    ax.set_xlabel("optimiser steps to held-out exact-match >= 0.99")
    ax.set_title("Steps to solve: seeds (dots; x = not solved within the budget),\nmedian (black bar) and IQR (grey band)",
                 fontsize=10)
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- report

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


def write_report(store: RunStore, baseline: str | None = None, metric: str | None = None) -> Path:
    """Render ``trials.csv``, ``curves.csv``, the PNG figures and ``report.md`` from the stored trials.

    Args:
        store: the run.
        baseline: variant every other is compared with (default: :func:`resolve_baseline`).
        metric: comparison metric for P(A > B) (default: the experiment's, else ``heldout_ce``).

    Returns:
        The path of ``report.md``.

    Raises:
        StoreError: unreadable ``config.json``.  ValueError: unknown metric.
    """
    from . import experiments

    meta = store.meta()
    store.write_tables()
    df = trials_frame(store)
    spec = experiments.spec_from_meta(meta)
    if spec is not None and spec.kind != "train":
        return experiments.write_measurement_report(store, meta, df, spec)
    metric = metric or (spec.metric if spec else DEFAULT_METRIC)
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; expected one of {', '.join(METRICS)}")
    baseline = resolve_baseline(df, meta, baseline)
    rows = aggregate(df, baseline, metric, meta) if len(df) else []
    title = f"Experiment `{spec.name}`" if spec else "transformer-harness run"
    parts = [f"# {title}: run `{meta.get('run_id', store.root.name)}`", ""]
    parts += invalid_section(df)
    parts += ["Command:", "", f"```\n{meta.get('command', '')}\n```", ""]
    if spec:
        parts += experiments.intro_sections(spec)
        parts += experiments.claim_sections(spec, df, rows, baseline, metric, meta)
        parts += experiments.departure_sections(spec, df, rows, baseline, metric, meta)
    parts += ["## Environment", "", environment_block(meta), ""]
    parts += ["## Config", "", f"Preset `{meta.get('preset', '')}`; resolved:", "",
              f"```json\n{json.dumps(meta.get('config', {}), indent=1)}\n```", ""]
    if meta.get("points"):
        parts += ["## Sweep", "", "Each point is the config above with these values (lr_max: the largest "
                  "Adam step size the schedule reaches).", "", to_markdown(sweep_table(meta["points"])), ""]
    if len(df):
        order = variant_order(df, baseline, meta)
        parts += ["## Variants", "", to_markdown(variants_table(df, order)), ""]
    held = meta.get("heldout") or ("evaluation set: overlap with the training stream not recorded (a run "
                                    "made before the evaluation set was drawn disjoint from training)")
    parts += ["## Results", "", caption(meta, df, baseline, metric) if len(df) else "", "",
              f"_{held[0].upper() + held[1:]}._", "",
              to_markdown(summary_table(df, baseline, metric, meta, rows)), ""]
    if len(df) and "status" in df:
        bad = df[~df["status"].isin(TRAINED)]
        if not bad.empty:
            cols = [c for c in ("variant", "point", "seed", "status", "reason") if c in bad]
            parts += ["## Failures", "", "Diverged runs stay in every table (never dropped silently); runs "
                      "that raised an error are excluded from the statistics.", "", to_markdown(bad[cols]), ""]
    parts += unreadable_section(store)
    if spec:
        parts += experiments.result_sections(store, spec, df, rows, baseline, metric, meta)
    figs = []
    curves = curves_frame(store)
    series = _series(df, meta, baseline) if len(df) else None
    png = plot_curves(curves, store.root / "curves.png", series)
    if png:
        figs.append(("Training and held-out curves", png))
    png = plot_final_metrics(df, rows, store.root / "final_metrics.png") if rows else None
    if png:
        figs.append(("Final held-out cross-entropy and exact-match", png))
    budget = meta.get("config", {}).get("train", {}).get("steps")
    png = plot_steps_to_solve(df, rows, store.root / "steps_to_solve.png", budget) if rows else None
    if png:
        figs.append(("Steps to solve", png))
    if figs:
        parts += ["## Plots", ""]
        for name, p in figs:
            parts += [f"### {name}", "", f"![{name}]({p.name})", ""]
    total = _num(df, "wall_s").sum() if len(df) else 0.0
    parts += [f"Trials: {len(df)}; summed trial wall time: {total:.1f} s; "
              f"run wall time: {meta.get('run_wall_s', float('nan')):.1f} s.", ""]
    path = store.root / "report.md"
    atomic_write_text(path, "\n".join(parts))
    return path


def unreadable_section(store: RunStore) -> list[str]:
    """Report lines naming the trial files that could not be read (``trials/quarantine/``)."""
    moved = store.quarantined()
    if not moved:
        return []
    rows = [{"file": f"trials/{q['original']}", "moved to": f"trials/quarantine/{q['file']}", "reason": q["reason"],
             "stored again": "yes" if (store.trials_dir / q["original"]).is_file() else "no"} for q in moved]
    return ["## Unreadable trial files", "", f"{len(rows)} trial file(s) could not be read (corrupt or foreign) "
            "and were moved to `trials/quarantine/`; their trials are not in any table above until they are "
            f"stored again (`python -m harness run --resume {store.root}` runs them).", "",
            to_markdown(pd.DataFrame(rows)), ""]


def sweep_table(points: dict[str, dict]) -> pd.DataFrame:
    """One row per sweep point: the dotted config keys that vary across points, and lr_max."""
    keys = []
    for section in ("model", "train"):
        names = {k for cfg in points.values() for k in (cfg.get(section) or {})}
        for k in sorted(names):
            if len({json.dumps((cfg.get(section) or {}).get(k)) for cfg in points.values()}) > 1:
                keys.append((section, k))
    return pd.DataFrame([{"point": name, **{f"{s}.{k}": (cfg.get(s) or {}).get(k) for s, k in keys},
                          "lr_max": f"{lr_max(cfg):.3g}"} for name, cfg in points.items()])


def is_nan(x) -> bool:
    try:
        return math.isnan(float(x))
    except (TypeError, ValueError):
        return False
