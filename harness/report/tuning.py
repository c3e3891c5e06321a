"""Learning-rate sweeps in the report: each variant's learning rate chosen on dev, the tuned verdict,
Wortsman et al.'s learning-rate sensitivity and the figure of the dev metric against the learning rate.

A run is a learning-rate sweep when its sweep points (``config.json`` ``points``) differ in
``train.lr`` and in nothing else (``run --lr-grid``, or an experiment whose ``[sweep]`` has only
``"train.lr"``). Then, per variant:

* **Choice** (:func:`choose_lrs`): the point whose median over seeds of the *dev* counterpart of the
  comparison metric is best (a diverged trial counts as the worst value, so a learning rate that
  diverges on some seeds is chosen only when every other is worse); ties go to the smaller learning
  rate. Only dev numbers take part: the test split is read once, for the verdicts.
* **Tuned verdict** (:func:`tuned_frame`): every variant at its own chosen learning rate, paired by
  seed with the baseline at *its* chosen learning rate, on the test metric, with the same sign-test
  rule as every other verdict (:func:`harness.stats.verdict`).
* **Sensitivity** (:func:`sensitivity`): Wortsman et al. 2023 ("Small-scale proxies for large-scale
  Transformer training instabilities", §2.2), the mean over the grid of the gap to the best
  learning rate, E_eta[min(l(eta), l_0) - min_eta l(eta)], with l the final dev cross-entropy
  (the median over seeds) and l_0 the loss at initialisation, here ln V (a uniform prediction), which
  also stands for a diverged trial. Units: nats/token. 0 means every learning rate of the grid
  reached the best loss.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from .. import metrics
from ..runmeta import RunMeta
from .frames import TRAINED, _num

#: The point name of a variant's trials at its chosen learning rate in :func:`tuned_frame`.
TUNED = "tuned"
#: The cross-entropy column the sensitivity reads (dev split), and the test one it falls back to.
DEV_CE, TEST_CE = "dev_ce", "heldout_ce"


def dev_column(metric: str, df: pd.DataFrame) -> str | None:
    """The dev-split column of the test metric ``metric`` (:func:`harness.metrics.dev_column`:
    ``heldout_ce`` -> ``dev_ce``, ``wer`` -> ``dev_wer``), or None when the run has none."""
    name = metrics.dev_column(metric)
    return name if name in df.columns else None


def swept_lrs(meta: RunMeta | None) -> dict[str, float] | None:
    """``{point: train.lr}`` when the run's sweep points differ in ``train.lr`` and nothing else
    (at least two points), else None."""
    points = (meta.points or {}) if meta is not None else {}
    if len(points) < 2:
        return None
    flat = {name: {f"{s}.{k}": json.dumps(v, sort_keys=True) for s in ("model", "train", "task")
                   for k, v in (cfg.get(s) or {}).items()} for name, cfg in points.items()}
    keys = set().union(*flat.values())
    varying = {k for k in keys if len({f.get(k) for f in flat.values()}) > 1}
    if varying != {"train.lr"}:
        return None
    return {name: float((cfg.get("train") or {})["lr"]) for name, cfg in points.items()}


def _worst(higher_is_better: bool) -> float:
    return -math.inf if higher_is_better else math.inf


def _point_values(df: pd.DataFrame, variant: str, point: str, column: str, higher_is_better: bool) -> np.ndarray:
    """One value per seed that ran: diverged (or non-finite) trials as the worst value."""
    g = df[(df["variant"] == variant) & (df["point"] == point) & (df["status"].isin(TRAINED) | (df["status"] == "diverged"))]
    v = _num(g, column).where(g["status"].isin(TRAINED)).to_numpy(dtype=float)
    return np.where(np.isfinite(v), v, _worst(higher_is_better))


def choose_lrs(df: pd.DataFrame, lrs: dict[str, float], column: str, higher_is_better: bool
               ) -> dict[str, dict]:
    """Each variant's chosen point on ``column`` (a dev metric): ``{variant: {"point", "lr", "median",
    "medians": {point: median}}}``. Rule: best median over seeds (diverged = worst); ties to the
    smaller learning rate; a variant with no trained trial at any point is left out."""
    out = {}
    for variant in dict.fromkeys(df["variant"]):
        medians = {}
        for point in sorted(lrs, key=lrs.get):
            v = _point_values(df, variant, point, column, higher_is_better)
            if len(v):
                medians[point] = float(np.median(v))
        finite = {p: m for p, m in medians.items() if np.isfinite(m)}
        if not finite:
            continue
        sign = -1.0 if higher_is_better else 1.0
        best = min(finite, key=lambda p: (sign * finite[p], lrs[p]))
        out[variant] = {"point": best, "lr": lrs[best], "median": finite[best], "medians": medians}
    return out


def tuned_frame(df: pd.DataFrame, chosen: dict[str, dict]) -> pd.DataFrame:
    """The trials of each variant at its chosen point, relabelled point :data:`TUNED` (so the
    paired verdicts of :func:`harness.report.aggregate` pair every variant's tuned trials with the
    baseline's tuned trials by seed)."""
    parts = [df[(df["variant"] == v) & (df["point"] == c["point"])].assign(point=TUNED) for v, c in chosen.items()]
    return pd.concat(parts, ignore_index=True) if parts else df.iloc[0:0]


def sensitivity(df: pd.DataFrame, lrs: dict[str, float], variant: str, vocab: int, column: str = DEV_CE) -> float:
    """Wortsman et al. 2023 §2.2's learning-rate sensitivity of ``variant`` (nats/token): the mean over
    the grid's points of min(l, l_0) - min over points of l, with l the median over seeds of ``column``
    and l_0 = ln(``vocab``) (a diverged trial counts as l_0). nan without any value."""
    l0 = math.log(vocab)
    losses = []
    for point in lrs:
        v = _point_values(df, variant, point, column, higher_is_better=False)
        if len(v):
            losses.append(min(float(np.median(v)), l0))
    if not losses:
        return float("nan")
    return float(np.mean(losses) - min(losses))


def seed_sensitivities(df: pd.DataFrame, lrs: dict[str, float], variant: str, vocab: int,
                       column: str = DEV_CE) -> dict[int, float]:
    """:func:`sensitivity` of each seed's own curve over the grid (``{seed: nats/token}``), for paired
    comparisons of two variants' sensitivities seed by seed; seeds missing a point are left out."""
    l0 = math.log(vocab)
    g = df[(df["variant"] == variant) & df["point"].isin(list(lrs)) & (df["status"].isin(TRAINED) | (df["status"] == "diverged"))]
    v = _num(g, column).where(g["status"].isin(TRAINED)).to_numpy(dtype=float)
    g = g.assign(_loss=np.minimum(np.where(np.isfinite(v), v, l0), l0))
    out = {}
    for seed, s in g.groupby("seed"):
        if set(s["point"]) >= set(lrs):
            losses = s.groupby("point")["_loss"].first()
            out[int(seed)] = float(losses.mean() - losses.min())
    return out


def plot_lr_sensitivity(df: pd.DataFrame, lrs: dict[str, float], column: str, higher_is_better: bool,
                        path: Path, chosen: dict[str, dict], label: str) -> Path | None:
    """The final dev metric against the learning rate (log axis): per variant the median over seeds
    (line), the range over seeds (band), diverged trials as crosses at the top edge, the chosen
    learning rate circled. Returns ``path``, or None without a value to draw."""
    from .plots import _colors, atomic_savefig, log_axis, pyplot

    variants = [v for v in dict.fromkeys(df["variant"]) if v in chosen]
    if not variants:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    order = sorted(lrs, key=lrs.get)
    xs = np.array([lrs[p] for p in order])
    finite_all = _num(df, column)[df["status"].isin(TRAINED)]
    finite_all = finite_all[np.isfinite(finite_all)]
    top = float(finite_all.max()) if len(finite_all) else 1.0
    edge = top if not higher_is_better else float(finite_all.min()) if len(finite_all) else 0.0
    for color, variant in zip(_colors(len(variants)), variants):
        med, lo, hi, div = [], [], [], []
        for p in order:
            g = df[(df["variant"] == variant) & (df["point"] == p)]
            v = _num(g, column).where(g["status"].isin(TRAINED)).to_numpy(dtype=float)
            ok = v[np.isfinite(v)]
            med.append(np.median(ok) if len(ok) else np.nan)
            lo.append(ok.min() if len(ok) else np.nan)
            hi.append(ok.max() if len(ok) else np.nan)
            div.append(int((g["status"] == "diverged").sum()))
        ax.plot(xs, med, marker="o", color=color, label=variant)
        ax.fill_between(xs, lo, hi, color=color, alpha=0.18, linewidth=0)
        bad = [x for x, d in zip(xs, div) if d]
        if bad:
            ax.scatter(bad, [edge] * len(bad), marker="x", color=color, s=60, zorder=3)
        ax.scatter([chosen[variant]["lr"]], [chosen[variant]["median"]], s=160, facecolors="none",
                   edgecolors=color, linewidths=1.5, zorder=3)
    log_axis(ax, "x")
    ax.set_xlabel("peak learning rate (train.lr)")
    ax.set_ylabel(f"{label} (dev, median over seeds)")
    ax.set_title("Dev metric against the learning rate: band = range over seeds, x = diverged, ring = chosen",
                 fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)
    return path


def lr_cell(lr: float, lrs: dict[str, float]) -> str:
    """A chosen learning rate, marked ``(edge)`` at the grid's smallest or largest value: the variant's best
    may lie outside the grid, so its tuned verdict may understate it."""
    edge = len(lrs) > 1 and lr in (min(lrs.values()), max(lrs.values()))
    return f"{lr:g} (edge)" if edge else f"{lr:g}"


def _cell(rows, variant: str, point: str = TUNED) -> str:
    """The verdict cell of ``variant`` at ``point`` among :func:`harness.report.aggregate` rows ("" for the
    baseline and where there is no comparison)."""
    for r in rows:
        if r.variant == variant and r.point == point and r.comparison is not None:
            return r.comparison.label()
    return ""


def tuning_lines(ctx) -> list[str]:
    """report.md's "Learning-rate tuning" section (empty unless the run swept ``train.lr`` only and
    has dev columns): per variant the chosen learning rate and its dev median, the sensitivity, the
    verdict at the config's own learning rate and the tuned verdict; then the figure."""
    from .tables import aggregate, to_markdown
    from .frames import run_metrics, verdict_metric

    lrs, df = swept_lrs(ctx.meta), ctx.df
    if not lrs or df.empty:
        return []
    metric = verdict_metric(ctx.metric, run_metrics(ctx.meta))
    column = dev_column(ctx.metric, df)
    if column is None:
        return ["## Learning-rate tuning", "", f"The run sweeps train.lr but has no dev column for `{ctx.metric}` "
                "(a run stored before the dev split), so no learning rate is chosen.", ""]
    chosen = choose_lrs(df, lrs, column, metric.higher_is_better)
    tuned = aggregate(tuned_frame(df, chosen), ctx.baseline, ctx.metric, ctx.meta)
    default = (ctx.meta.lr_grid or {}).get("default")
    at_default = next((p for p, v in lrs.items() if default is not None and math.isclose(v, default)), None)
    vocab = int((ctx.meta.config.get("model") or {}).get("vocab", 0) or 0)
    ce = DEV_CE if DEV_CE in df.columns else None
    rows = []
    for variant in dict.fromkeys(df["variant"]):
        c = chosen.get(variant)
        rows.append({"variant": variant, "chosen lr": lr_cell(c["lr"], lrs) if c else "none (every trial failed)",
                     f"{column} (median)": f"{c['median']:.4g}" if c else "",
                     "sensitivity (nats)": f"{sensitivity(df, lrs, variant, vocab, ce):.3f}" if ce and vocab > 1 else "",
                     f"verdict at lr {default:g}" if at_default else "verdict at the config's lr":
                         _cell(ctx.rows, variant, at_default) if at_default else "not in the grid",
                     "tuned verdict (test)": _cell(tuned, variant)})
    png = plot_lr_sensitivity(df, lrs, column, metric.higher_is_better, ctx.store.root / "lr_sensitivity.png",
                              chosen, column)
    lines = ["## Learning-rate tuning", "",
             f"Each variant's learning rate is the grid point with the best median over seeds of `{column}` (the dev "
             "split; a diverged trial counts as the worst value; ties go to the smaller learning rate). The tuned "
             f"verdict pairs each variant at its own chosen learning rate with `{ctx.baseline}` at its own, seed by "
             f"seed, on the test metric `{ctx.metric}`, with the same sign-test rule as every verdict "
             "(docs/statistics.md). Sensitivity: Wortsman et al. 2023 §2.2, the mean over the grid of the gap in "
             "median dev cross-entropy to the variant's best learning rate, each loss capped at ln V (the loss of a "
             "uniform prediction, which also stands for a diverged trial); 0 = every learning rate as good as the best. "
             "`(edge)`: chosen at the grid's smallest or largest learning rate, so the variant's best may lie outside "
             "the grid and its tuned verdict may understate it: widen the grid.",
             "", to_markdown(pd.DataFrame(rows)), ""]
    if png:
        lines += ["![Dev metric against the learning rate](lr_sensitivity.png)", ""]
    return lines
