"""The report's matplotlib figures (PNG): curves, final metrics, steps to solve; shared plot helpers.

matplotlib is imported on first use (``Agg`` backend), so importing this module stays cheap.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from ..runmeta import RunMeta

from ..store import atomic_write_bytes
from ..trial import NO_RESULT
from ..metrics import COPY_METRICS, DEV_SPLIT, EVAL_SPLITS, shown
from .frames import _num, point_order, variant_order


def atomic_savefig(fig, path: Path, **kwargs) -> None:
    """``fig.savefig(path, **kwargs)`` written atomically (:func:`atomic_write_bytes`); the format
    is taken from ``path``'s suffix."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format=Path(path).suffix.lstrip(".") or "png", **kwargs)
    atomic_write_bytes(path, buf.getvalue())


# ----------------------------------------------------------------------------- plots

def pyplot():
    """``matplotlib.pyplot`` with the Agg backend (files only, no display), imported on first use."""
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
    plt = pyplot()
    cmap = plt.get_cmap("tab10" if n <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(n)]


def _series(df: pd.DataFrame, meta: RunMeta | None, baseline: str | None) -> list[tuple[str, str]]:
    return [(v, p) for p in point_order(df, meta) for v in variant_order(df, baseline, meta)
            if ((df["variant"] == v) & (df["point"] == p)).any()]


def plot_curves(curves: pd.DataFrame, path: Path, series: list[tuple[str, str]] | None = None) -> Path | None:
    """Training loss per step, dev CE and dev exact-match per evaluation (``held-out`` in runs stored before
    the dev split), per variant (x sweep point): median over seeds with an interquartile band. Returns the path."""
    if curves.empty or "split" not in curves:
        return None
    plt = pyplot()
    if "point" not in curves:
        curves = curves.assign(point="")
    curves = curves.assign(point=curves["point"].fillna(""))
    series = series or list(dict.fromkeys(zip(curves["variant"], curves["point"])))
    if len(series) > MAX_OVERLAID:
        return plot_curves_grid(curves, path, series)
    look = _curve_looks(series)
    fig, axes = plt.subplots(1, 3, figsize=(16, 5.2))
    for variant, point in series:
        g = curves[(curves["variant"] == variant) & (curves["point"] == point)]
        if not g.empty:
            _plot_one_series(axes, g, _series_label(variant, point), *look[(variant, point)])
    _label_curve_axes(axes, curves)
    handles, labels = axes[0].get_legend_handles_labels()
    if not handles:
        handles, labels = axes[1].get_legend_handles_labels()
    ncol = min(len(labels), 4) or 1
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=9, frameon=False)
    rows = math.ceil(len(labels) / ncol) if labels else 1
    fig.tight_layout(rect=(0, 0.05 * rows + 0.02, 1, 1))
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)
    return path


def _curve_looks(series: list[tuple[str, str]]) -> dict[tuple[str, str], tuple]:
    """(variant, point) -> (colour, line style): colour = variant and style = point when 2-4 points
    are swept, else one colour per series (styles cycle every 20 series)."""
    styles = ["-", "--", ":", "-."]
    variants = list(dict.fromkeys(v for v, _ in series))
    points = list(dict.fromkeys(p for _, p in series))
    if 1 < len(points) <= len(styles):  # colour = variant, line style = sweep point
        vc = dict(zip(variants, _colors(len(variants))))
        return {(v, p): (vc[v], styles[points.index(p)]) for v, p in series}
    return {s: (c, styles[(i // 20) % len(styles)]) for i, (s, c) in enumerate(zip(series, _colors(len(series))))}


def _plot_one_series(axes, g: pd.DataFrame, label: str, color, ls: str) -> None:
    """One series' training loss (mean over >= 10 steps), held-out CE and exact-match medians with IQR bands."""
    many = g["seed"].nunique() > 1
    tr = g[g["split"] == "train"].groupby("step")["loss"]
    if len(tr):
        med = _smooth(tr.median())
        axes[0].plot(med.index, med.values, color=color, ls=ls, lw=1.4, label=label)
        if many:
            axes[0].fill_between(med.index, _smooth(tr.quantile(0.25)), _smooth(tr.quantile(0.75)),
                                 color=color, alpha=0.15, lw=0)
    ho = g[g["split"].isin(EVAL_SPLITS)]
    for ax, col in ((axes[1], "loss"), (axes[2], "exact_match")):
        if col not in ho or ho[col].isna().all():
            continue
        h = ho.groupby("step")[col]
        med = h.median()
        ax.plot(med.index, med.values, color=color, ls=ls, marker="o", ms=3, lw=1.4, label=label)
        if many:
            ax.fill_between(med.index, h.quantile(0.25), h.quantile(0.75), color=color, alpha=0.15, lw=0)


def _label_curve_axes(axes, curves: pd.DataFrame) -> None:
    from matplotlib import ticker

    sc = _scale(axes[0], curves.loc[curves["split"] == "train", "loss"])
    axes[0].set(xlabel="optimiser step", ylabel=f"training loss, nats/token ({sc} scale)",
                title="Training loss (label-smoothed)\nmedian over seeds, IQR band, mean over >= 10 steps")
    sc = _scale(axes[1], curves.loc[curves["split"].isin(EVAL_SPLITS), "loss"])
    name = eval_name(curves)
    axes[1].set(xlabel="optimiser step", ylabel=f"{name} cross-entropy, nats/token ({sc} scale)",
                title=f"{name.capitalize()} cross-entropy (unsmoothed)\nmedian over seeds, IQR band")
    axes[2].set(xlabel="optimiser step", ylabel=f"{name} exact-match (fraction)", ylim=(-0.02, 1.02),
                title=f"{name.capitalize()} exact-match (run's decoding)\nmedian over seeds, IQR band")
    axes[2].axhline(0.99, color="grey", lw=0.8, ls="--")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True, nbins=6))  # 5-digit steps must not collide


def eval_name(curves: pd.DataFrame) -> str:
    """What a curve's evaluation rows score: ``dev`` (split ``dev``), or ``held-out`` in a run stored before the
    dev split (its periodic probes were drawn like the test set and its last point is the test set's)."""
    return "dev" if (curves["split"] == DEV_SPLIT).any() else "held-out"


MAX_OVERLAID = 6  #: more series than this: one small panel per series instead of overlaid lines


def _smooth(s: pd.Series) -> pd.Series:
    """A training-loss series (index: step) as a running mean over at least 10 steps: 10 rows when
    every step has a row, fewer when each row is already the mean of ``train.log_every`` steps."""
    stride = float(pd.Series(s.index).diff().median()) if len(s) > 1 else 1.0
    return s.rolling(max(1, round(10 / max(stride, 1.0))), min_periods=1).mean()


def plot_curves_grid(curves: pd.DataFrame, path: Path, series: list[tuple[str, str]]) -> Path:
    """Small multiples for many variants: one panel per variant (x point) with its training loss
    (solid, mean over >= 10 steps) and held-out cross-entropy (dashed, markers), median over seeds with
    IQR bands; the first series (the baseline) is repeated in grey in every panel."""
    plt = pyplot()
    from matplotlib import ticker

    ncols = 4
    nrows = math.ceil(len(series) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.0 * nrows + 0.8), sharex=True, sharey=True,
                             squeeze=False)
    colors = ["tab:blue"] * len(series)  # one variant per panel: one strong colour reads best

    def medians(g):
        tr = g[g["split"] == "train"].groupby("step")["loss"]
        ho = g[g["split"].isin(EVAL_SPLITS)].groupby("step")["loss"]
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
            ax.plot(ho.median().index, ho.median(), color=color, lw=1.6, ls="--", marker="o", ms=3,
                    label=f"{eval_name(curves)} CE")
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
    fig.suptitle(f"Training loss (solid, mean over >= 10 steps) and {eval_name(curves)} cross-entropy (dashed): "
                 "median over seeds, "
                 "IQR bands; grey: the baseline", fontsize=11)
    fig.tight_layout(rect=(0, 0.04, 1, 0.97))
    atomic_savefig(fig, path, dpi=100)
    plt.close(fig)
    return path


#: The metric axis of the final-metrics figure (linear scale) spans at least this fraction of the
#: largest value shown, and at least :data:`MIN_SPAN_FLOOR` (in the metric's unit): a rounding-level
#: difference (0.001 nats on a CE of 0.1) then takes at most ~5 % of the axis instead of filling it.
MIN_SPAN_FRACTION = 0.2
MIN_SPAN_FLOOR = 0.01
SAME_FUNCTION_MARK = "= baseline (check)"  #: the annotation of a variant in the baseline's check class


def min_span_limits(lo: float, hi: float, fraction: float = MIN_SPAN_FRACTION,
                    floor: float = MIN_SPAN_FLOOR) -> tuple[float, float]:
    """``(lo, hi)`` widened about its centre to span at least ``max(fraction * max(|lo|, |hi|), floor)``.

    A non-negative range stays non-negative (shifted up from 0 when widening would cross it).
    Non-finite bounds are returned as given.
    """
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return lo, hi
    need = max(fraction * max(abs(lo), abs(hi)), floor)
    if hi - lo >= need:
        return lo, hi
    mid = (lo + hi) / 2
    new_lo, new_hi = mid - need / 2, mid + need / 2
    if lo >= 0 > new_lo:
        new_lo, new_hi = 0.0, need
    return new_lo, new_hi


def note_zoom(ax, axis: str = "x") -> bool:
    """Say in ``ax``'s title when its linear ``axis`` does not start at 0 (a zoomed axis makes a
    small gap look large). Returns whether it is zoomed."""
    if (ax.get_xscale() if axis == "x" else ax.get_yscale()) != "linear":
        return False
    lo, hi = ax.get_xlim() if axis == "x" else ax.get_ylim()
    if not lo > 0:
        return False
    ax.set_title(ax.get_title() + f"\nZOOMED: the axis starts at {lo:.3g}, not 0 (span {hi - lo:.3g})",
                 fontsize=10)
    return True


def _mark_same_function(ax, rows: list, y_of) -> None:
    """A hatched band and the note :data:`SAME_FUNCTION_MARK` on the rows that check proves compute
    the baseline's function (their differences from it are rounding)."""
    for i, r in enumerate(rows):
        if getattr(r, "same_function", False) and not r.invalid:
            y = y_of(i)
            ax.axhspan(y - 0.4, y + 0.4, facecolor="none", edgecolor="0.82", hatch="//", lw=0, zorder=0)
            ax.annotate(SAME_FUNCTION_MARK, xy=(0.99, y + 0.24), xycoords=("axes fraction", "data"), ha="right",
                        va="center", fontsize=8, color="0.25", zorder=5,
                        bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none"})


def plot_final_metrics(df: pd.DataFrame, rows: list, path: Path, metrics=COPY_METRICS) -> Path | None:
    """Per variant (x point): held-out CE and exact-match (where ``metrics`` plot it: not ``text``), then each
    metric of the task's own (``metrics``, those shown in ``plot``: ``g2p``'s WER and PER), every seed as a grey dot and the IQM
    with its 95 % bootstrap CI as a coloured bar; variants in the baseline's check class hatched
    and marked :data:`SAME_FUNCTION_MARK`. A linear CE axis spans at least
    :func:`min_span_limits`. Returns the path, or None without data."""
    if not rows:
        return None
    plt = pyplot()
    labels = [_series_label(r.variant, r.point) for r in rows]
    colors = _colors(len(rows))
    h = max(2.6, 0.42 * len(rows) + 1.4)
    rates = [m for m in shown(metrics, "plot") if not m.is_core and any(r.value(m.name) is not None for r in rows)]
    em = int(any(m.name == "exact_match" for m in shown(metrics, "plot")))  # text plots no exact match
    n_rows = math.ceil((1 + em + len(rates)) / 2)  # two panels a row: g2p's four stay readable (not a 24-inch strip)
    fig, grid = plt.subplots(n_rows, 2, figsize=(13, h * n_rows + 0.4 * (n_rows - 1)), sharey=True, squeeze=False)
    axes = list(grid.flat)
    rng = np.random.default_rng(0)
    ce_scale = _scale(axes[0], _num(df[df["status"] == "ok"], "heldout_ce"), "x")
    floor = (f"; axis >= {MIN_SPAN_FRACTION:.0%} of the value wide" if ce_scale == "linear" else "")
    panels = [(axes[0], "heldout_ce", f"Held-out cross-entropy, nats/token ({ce_scale} scale{floor})"),
              (axes[1], "exact_match", "Held-out exact-match (fraction)")][:1 + em]
    panels += [(axes[1 + em + i], m.name, f"Held-out {m.name.upper() if len(m.name) <= 3 else m.name} ({m.unit}, "
                f"{m.direction} is better)") for i, m in enumerate(rates)]
    for ax, key, title in panels:
        for i, (r, color) in enumerate(zip(rows, colors)):
            g = df[(df["variant"] == r.variant) & (df["point"] == r.point) & (df["status"] == "ok")]
            vals = _num(g, key).dropna().to_numpy()
            y = len(rows) - 1 - i
            ax.scatter(vals, y + rng.uniform(-0.18, 0.18, vals.size), s=14, color="0.55", zorder=2)
            point, lo, hi = r.value(key) or (math.nan,) * 3
            if not math.isnan(point):
                xerr = None if math.isnan(lo) else [[point - lo], [hi - point]]
                ax.errorbar([point], [y], xerr=xerr, fmt="D", color=color, ms=7, capsize=5, lw=2, zorder=3)
        _mark_same_function(ax, rows, lambda i: len(rows) - 1 - i)
        ax.set_title(title + "\nIQM (diamond) with 95 % bootstrap CI; grey: seeds", fontsize=10)
        ax.grid(alpha=0.3, axis="x")
    if ce_scale == "linear":
        axes[0].set_xlim(*min_span_limits(*axes[0].get_xlim()))
    for ax in [axes[0]] + axes[1 + em:1 + em + len(rates)]:
        note_zoom(ax)
    for ax in axes[1 + em + len(rates):]:
        ax.set_visible(False)
    if em:
        axes[1].set_xlim(-0.03, 1.03)
        axes[1].axvline(0.99, color="grey", lw=0.8, ls="--")
    axes[0].set_yticks(range(len(rows)))
    axes[0].set_yticklabels(labels[::-1])
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)
    return path


def plot_steps_to_solve(df: pd.DataFrame, rows: list, path: Path, budget: int | None) -> Path | None:
    """Steps to held-out exact-match >= 0.99: every seed as a dot, unsolved runs as x at the
    right edge, the median as a black bar and the IQR as a thick line; variants in the baseline's
    check class hatched and marked :data:`SAME_FUNCTION_MARK` (a different step there is rounding
    crossing an evaluation boundary)."""
    if not rows:
        return None
    plt = pyplot()
    labels = [_series_label(r.variant, r.point) for r in rows]
    colors = _colors(len(rows))
    finite_all = _num(df, "steps_to_solve").dropna()
    right = float(budget or (finite_all.max() if len(finite_all) else 1))
    edge = right * 1.06
    fig, ax = plt.subplots(figsize=(9, max(2.6, 0.42 * len(rows) + 1.4)))
    rng = np.random.default_rng(1)
    for i, (r, color) in enumerate(zip(rows, colors)):
        y = len(rows) - 1 - i
        g = df[(df["variant"] == r.variant) & (df["point"] == r.point) & (~df["status"].isin(NO_RESULT))]
        s = _num(g, "steps_to_solve").where(g["status"] == "ok")
        solved = s.dropna().to_numpy()
        n_uns = len(g) - solved.size
        ax.scatter(solved, y + rng.uniform(-0.15, 0.15, solved.size), s=18, color=color, zorder=3)
        if n_uns:
            ax.scatter([edge] * n_uns, y + rng.uniform(-0.15, 0.15, n_uns), marker="x", s=30, color=color, zorder=3)
        med, q1, q3 = r.steps_to_solve
        clip = lambda v: edge if math.isinf(v) else v  # noqa: E731
        if not math.isnan(med):
            ax.plot([clip(q1), clip(q3)], [y, y], color="black", lw=4, alpha=0.35, zorder=2)
            ax.plot([clip(med)] * 2, [y - 0.3, y + 0.3], color="black", lw=2, zorder=4)
    _mark_same_function(ax, rows, lambda i: len(rows) - 1 - i)
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
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)
    return path

