"""Reports: pandas tables rendered with tabulate (GitHub markdown) and matplotlib plots.

:func:`summary_table` aggregates trials per variant (per sweep point); :func:`write_report`
renders ``report.md`` (environment block, command, config, table, failures, plots) from what
a run stored, so ``python -m harness report RUN`` can re-render it at any time.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from .store import RunStore, atomic_write_text

SLOT_COLS = ["slot_norm", "slot_embedding", "slot_attention", "slot_mask"]


def trials_frame(store: RunStore) -> pd.DataFrame:
    rows = [{k: v for k, v in t["row"].items() if k != "traceback"} for t in store.load_trials()]
    df = pd.DataFrame(rows)
    if "point" not in df.columns and len(df):
        df["point"] = ""
    return df


def curves_frame(store: RunStore) -> pd.DataFrame:
    return pd.DataFrame([{"variant": t["row"]["variant"], "seed": t["row"]["seed"],
                          "point": t["row"].get("point", ""), **c}
                         for t in store.load_trials() for c in t.get("curve", [])])


def _fmt(values: pd.Series, digits: int = 3) -> str:
    v = pd.to_numeric(values, errors="coerce").dropna()
    if v.empty:
        return "—"
    if len(v) == 1:
        return f"{v.iloc[0]:.{digits}f}"
    return f"{v.mean():.{digits}f} ± {v.std(ddof=1):.{digits}f}"


def summary_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (variant, sweep point): slots, unique params and metrics over seeds
    (the value for one seed, mean ± std for several; failed trials excluded from metrics)."""
    out = []
    if df.empty:
        return pd.DataFrame()
    for (variant, point), g in df.groupby(["variant", "point"], sort=True, dropna=False):
        ok = g[g["status"] == "ok"] if "status" in g else g
        first = g.iloc[0]
        row = {"variant": variant}
        if point:
            row["point"] = point
        for c in SLOT_COLS:
            row[c.removeprefix("slot_")] = first.get(c, "")
        row["params"] = int(first["params"]) if "params" in g and pd.notna(first.get("params")) else "—"
        row["seeds"] = len(g)
        row["exact_match"] = _fmt(ok.get("exact_match", pd.Series(dtype=float)))
        row["heldout_ce"] = _fmt(ok.get("heldout_ce", pd.Series(dtype=float)))
        row["token_acc"] = _fmt(ok.get("heldout_token_acc", pd.Series(dtype=float)))
        row["steps_to_solve"] = _fmt(ok.get("steps_to_solve", pd.Series(dtype=float)), 0)
        row["time_to_solve_s"] = _fmt(ok.get("time_to_solve_s", pd.Series(dtype=float)), 1)
        row["tokens_per_s"] = _fmt(ok.get("tokens_per_s", pd.Series(dtype=float)), 0)
        row["wall_s"] = _fmt(g.get("wall_s", pd.Series(dtype=float)), 1)
        bad = g[g["status"] != "ok"] if "status" in g else g.iloc[0:0]
        row["status"] = "ok" if bad.empty else f"{len(bad)}/{len(g)} " + ",".join(sorted(set(bad["status"])))
        out.append(row)
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
    return "\n".join(lines)


def plot_curves(curves: pd.DataFrame, path: Path) -> Path | None:
    """Training loss (per step) and held-out exact-match (per evaluation) per variant:
    the median over seeds with an interquartile band. Returns the PNG path, or None."""
    if curves.empty:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for variant, g in curves.groupby("variant"):
        tr = g[g["split"] == "train"].groupby("step")["loss"]
        med = tr.median().rolling(10, min_periods=1).mean()
        line, = ax1.plot(med.index, med.values, label=variant, lw=1.2)
        if g["seed"].nunique() > 1:
            ax1.fill_between(med.index, tr.quantile(0.25).rolling(10, min_periods=1).mean(),
                             tr.quantile(0.75).rolling(10, min_periods=1).mean(), color=line.get_color(), alpha=0.15)
        ho = g[g["split"] == "heldout"].groupby("step")["exact_match"]
        ax2.plot(ho.median().index, ho.median().values, marker="o", ms=3, label=variant, color=line.get_color())
    ax1.set(xlabel="step", ylabel="training loss (label-smoothed CE, nats/token)", yscale="log",
            title="Training loss (median over seeds, 10-step mean)")
    ax2.set(xlabel="step", ylabel="held-out exact-match", ylim=(0, 1.02),
            title="Held-out exact-match (greedy decoding)")
    ax2.axhline(0.99, color="grey", lw=0.8, ls="--")
    ax2.legend(fontsize=7, ncol=2, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(store: RunStore) -> Path:
    """Render ``trials.csv``, ``curves.csv``, plots and ``report.md`` from the stored trials."""
    meta = store.meta()
    store.write_tables()
    df = trials_frame(store)
    table = summary_table(df)
    parts = [f"# transformer-harness run `{meta.get('run_id', store.root.name)}`", ""]
    parts += ["Command:", "", f"```\n{meta.get('command', '')}\n```", ""]
    parts += ["## Environment", "", environment_block(meta), ""]
    parts += ["## Config", "", f"Preset `{meta.get('preset', '')}`; resolved:", "",
              f"```json\n{json.dumps(meta.get('config', {}), indent=1)}\n```", ""]
    parts += ["## Results", "",
              "exact_match: fraction of the held-out sequences (eval seed fixed) that greedy decoding "
              "reproduces exactly; heldout_ce: unsmoothed cross-entropy, nats/token; params: unique "
              "parameters (tied weights counted once); steps/time_to_solve: first evaluation with "
              "exact-match >= 0.99; tokens_per_s: target tokens per second of training. "
              "Several seeds: mean ± std.", "", to_markdown(table), ""]
    if not df.empty and "status" in df:
        bad = df[df["status"] != "ok"]
        if not bad.empty:
            parts += ["## Failures", "", to_markdown(bad[["variant", "seed", "status", "reason"]]), ""]
    png = plot_curves(curves_frame(store), store.root / "curves.png")
    if png:
        parts += ["## Curves", "", f"![training and held-out curves]({png.name})", ""]
    total = pd.to_numeric(df.get("wall_s", pd.Series(dtype=float)), errors="coerce").sum() if not df.empty else 0
    parts += [f"Trials: {len(df)}; summed trial wall time: {total:.1f} s; "
              f"run wall time: {meta.get('run_wall_s', float('nan')):.1f} s.", ""]
    path = store.root / "report.md"
    atomic_write_text(path, "\n".join(parts))
    return path


def is_nan(x) -> bool:
    try:
        return math.isnan(float(x))
    except (TypeError, ValueError):
        return False
