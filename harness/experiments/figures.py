"""The experiments' matplotlib figures: gradient norm against depth and per layer (grad-norm
experiments), failure rate per sweep point (experiments with a failure definition)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .. import stats
from ..report.plots import _colors, pyplot, atomic_savefig, log_axis


def plot_grad_norm_depth(ok, path: Path, param: str, theory: dict | None = None) -> Path | None:
    """log-log: last-layer gradient norm against N per variant (seeds as dots, mean line,
    fitted slope dashed), decoder and encoder side by side; a variant whose predicted slope
    (``theory``: variant -> slope, the experiment's ``theory_slope``) is -0.5 also gets the
    N^-1/2 line through its first mean."""
    theory = theory or {}
    if ok.empty:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    variants = list(dict.fromkeys(ok["variant"]))
    colors = _colors(len(variants))
    for ax, stack in zip(axes, ("decoder", "encoder")):
        col = f"{stack[:3]}_last"
        for v, color in zip(variants, colors):
            g = ok[ok["variant"] == v]
            Ns = sorted(set(int(n) for n in g["N"]))
            ax.scatter(g["N"] * np.exp(np.random.default_rng(0).uniform(-0.03, 0.03, len(g))), g[col],
                       s=12, color=color, alpha=0.5)
            means = [g[g["N"] == n][col].mean() for n in Ns]
            label = f"{v} ({g.iloc[0].get('slot_norm', '')}-norm)"
            if len(Ns) >= 2:
                s, lo, hi = stats.loglog_slope_ci(Ns, [g[g["N"] == n][col].to_numpy(float) for n in Ns])
                label += f": slope {s:.2f} [{lo:.2f}, {hi:.2f}]"
                x = np.array(Ns, dtype=float)
                ly = np.log(g[col].to_numpy(float)).mean() + s * (np.log(x) - np.log(g["N"].to_numpy(float)).mean())
                ax.plot(x, np.exp(ly), ls="--", color=color, lw=1)
            ax.plot(Ns, means, marker="o", color=color, lw=1.8, label=label)
            if theory.get(v) == -0.5 and len(Ns) >= 2:
                x = np.array(Ns, dtype=float)
                ax.plot(x, means[0] * (x / x[0]) ** -0.5, ls=":", color="0.4", lw=1.2,
                        label="∝ N^-1/2 from the first pre-norm mean (Theorem 1)")
        ax.set_xscale("log")
        log_axis(ax, "y")
        Ns_all = sorted(set(int(n) for n in ok["N"]))
        ax.set_xticks(Ns_all)
        ax.set_xticklabels([str(n) for n in Ns_all])
        ax.minorticks_off()
        ax.set(xlabel="depth N (layers in encoder and in decoder)",
               ylabel=f"‖∂L/∂{param}‖_F at init (log scale)",
               title=f"Last {stack} layer: gradient norm vs depth\nseeds (dots), mean (solid), log-log fit (dashed)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)
    return path


def plot_grad_norm_layers(store, ok, path: Path, param: str) -> Path | None:
    """Per-layer gradient norm profile at the depth closest to 6 (Xiong et al. Fig. 3a/b)."""
    rows = [{"variant": t.row["variant"], "N": t.row.get("N"), **c} for t in store.load_trials()
            if t.status == "ok" for c in t.curve]
    if not rows:
        return None
    cur = pd.DataFrame(rows)
    Ns = sorted(set(int(n) for n in cur["N"]))
    n_show = min(Ns, key=lambda n: (abs(n - 6), n))
    cur = cur[cur["N"] == n_show]
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6), sharey=True)
    variants = list(dict.fromkeys(cur["variant"]))
    for ax, stack in zip(axes, ("encoder", "decoder")):
        for v, color in zip(variants, _colors(len(variants))):
            g = cur[(cur["variant"] == v) & (cur["stack"] == stack)].groupby("layer")["grad_norm"]
            med = g.median()
            ax.plot(med.index + 1, med.values, marker="o", color=color, label=v)
            ax.fill_between(med.index + 1, g.quantile(0.25), g.quantile(0.75), color=color, alpha=0.15, lw=0)
        ax.set(xlabel=f"{stack} layer (1 = nearest the input)", ylabel=f"‖∂L/∂{param}‖_F at init",
               title=f"{stack}, N = {n_show}: median over seeds, IQR band")
        log_axis(ax, "y")
        ax.set_xticks(range(1, n_show + 1))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)
    return path




def plot_failures(ff, path: Path, definition: str) -> Path | None:
    """Failure rate per sweep point and variant with Wilson 95 % bars."""
    ff = ff[ff["point"] != "(all points)"]
    if ff.empty:
        return None
    plt = pyplot()
    points = list(dict.fromkeys(ff["point"]))
    variants = list(dict.fromkeys(ff["variant"]))
    fig, ax = plt.subplots(figsize=(max(6.5, 1.6 * len(points) + 3), 4.6))
    width = 0.7 / max(1, len(variants))
    for j, (v, color) in enumerate(zip(variants, _colors(len(variants)))):
        g = ff[ff["variant"] == v].set_index("point").reindex(points)
        x = np.arange(len(points)) + (j - (len(variants) - 1) / 2) * width
        rate = g["_k"] / g["_n"]
        ax.bar(x, rate, width=width * 0.9, color=color, alpha=0.75, label=v)
        ax.errorbar(x, rate, yerr=[rate - g["_lo"], g["_hi"] - rate], fmt="none", ecolor="black", capsize=4, lw=1.2)
        for xi, k, n in zip(x, g["_k"], g["_n"]):
            if not np.isnan(n):
                ax.text(xi, 1.05, f"{int(k)}/{int(n)}", ha="center", fontsize=8)
    ax.set_xticks(range(len(points)))
    ax.set_xticklabels([p or "(no sweep)" for p in points])
    ax.set_ylim(0, 1.25)
    ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    ax.set_ylabel("fraction of seeds that failed to converge")
    ax.set_title("Failure rate with Wilson 95 % intervals\n" + definition.replace("**", ""), fontsize=9, wrap=True)
    ax.legend(fontsize=9, loc="upper center", ncol=len(variants), frameon=False)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)
    return path

