"""``python -m harness compare RUN_A RUN_B``: two runs side by side, a regression gate for CI.

For every variant (x sweep point) present in both runs and every gated metric, the report
shows A's and B's IQM with their 95 % bootstrap CIs and the difference B - A with a 95 %
bootstrap CI (seeds resampled independently within each run). A metric **regressed** when
that CI lies entirely on the worse side of zero, beyond ``--tolerance``; the divergence rate
regressed when B's Wilson interval lies entirely above A's. Exit codes: 1 when anything
regressed, 0 otherwise, 2 on bad input (not a run, no trials, nothing in common).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from .. import stats
from ..errors import ConfigError, HarnessError
from ..report import METRICS, to_markdown, trials_frame
from .report import resolve_run

DEFAULT_METRICS = ("heldout_ce", "exact_match")


def register(sub, parents):
    p = sub.add_parser("compare", parents=parents, help="compare two runs per variant; exit 1 on a regression",
                       description=__doc__.split("\n", 1)[1].strip())
    p.add_argument("run_a", metavar="RUN_A", help="reference run (folder, run id or 'latest')")
    p.add_argument("run_b", metavar="RUN_B", help="candidate run (folder, run id or 'latest')")
    p.add_argument("--results-dir", default="results", metavar="DIR", help="where runs are stored (default results)")
    p.add_argument("--metrics", default=",".join(DEFAULT_METRICS), metavar="NAMES",
                   help=f"comma-separated metrics to gate (default {','.join(DEFAULT_METRICS)}; "
                        f"known: {', '.join(METRICS)}); the divergence rate is always gated")
    p.add_argument("--tolerance", type=float, default=0.0, metavar="X",
                   help="a difference must exceed X (absolute, in the metric's unit) beyond its CI to count "
                        "as a regression (default 0)")
    p.set_defaults(func=main)


def _diff_stat(*samples, axis=-1):
    a, b = samples
    return stats._iqm_axis(b) - stats._iqm_axis(a)


def compare_frames(a: pd.DataFrame, b: pd.DataFrame, metrics=DEFAULT_METRICS, tolerance: float = 0.0) -> pd.DataFrame:
    """One row per (variant, point, metric) with A, B, the difference and a status.

    Status: ``regressed``, ``improved`` (the CI lies on the better side), ``no change``
    (the CI covers the tolerance band), ``too few seeds`` (a CI needs
    :data:`harness.stats.MIN_N_FOR_CI` finished runs per side), ``only in A`` / ``only in B``.

    Raises:
        ConfigError: an unknown metric or a negative tolerance.
    """
    for m in metrics:
        if m not in METRICS:
            raise ConfigError(f"unknown metric {m!r} for --metrics; expected names from {', '.join(METRICS)}")
    if tolerance < 0:
        raise ConfigError(f"--tolerance must be >= 0, got {tolerance}")
    keys_a = list(dict.fromkeys(zip(a["variant"], a["point"])))
    keys_b = list(dict.fromkeys(zip(b["variant"], b["point"])))
    rows = []
    for key in keys_a + [k for k in keys_b if k not in keys_a]:
        variant, point = key
        base = {"variant": variant, "point": point}
        if key not in keys_b or key not in keys_a:
            rows.append({**base, "metric": "—", "A": "—", "B": "—", "B - A [95% CI]": "—",
                         "status": "only in A" if key not in keys_b else "only in B"})
            continue
        ga = a[(a["variant"] == variant) & (a["point"] == point) & (a["status"] != "failed")]
        gb = b[(b["variant"] == variant) & (b["point"] == point) & (b["status"] != "failed")]
        for m in metrics:
            higher = METRICS[m][0]
            va = pd.to_numeric(ga[ga["status"] == "ok"].get(m), errors="coerce").dropna().to_numpy(float)
            vb = pd.to_numeric(gb[gb["status"] == "ok"].get(m), errors="coerce").dropna().to_numpy(float)
            va, vb = va[np.isfinite(va)], vb[np.isfinite(vb)]
            ia, ib = stats.iqm_ci(va), stats.iqm_ci(vb)
            d = ib[0] - ia[0] if va.size and vb.size else float("nan")
            lo, hi = stats.bootstrap_ci([va, vb], _diff_stat)
            if math.isnan(lo):
                status = "too few seeds"
            else:
                worse_lo, worse_hi = (-hi, -lo) if higher else (lo, hi)  # oriented so > 0 is worse
                status = ("regressed" if worse_lo > tolerance else
                          "improved" if worse_hi < -tolerance else "no change")
            rows.append({**base, "metric": m, "A": stats.fmt_ci(*ia, 4), "B": stats.fmt_ci(*ib, 4),
                         "B - A [95% CI]": stats.fmt_ci(d, lo, hi, 4), "status": status})
        ka, na = int((ga["status"] == "diverged").sum()), len(ga)
        kb, nb = int((gb["status"] == "diverged").sum()), len(gb)
        wa, wb = stats.wilson_interval(ka, na), stats.wilson_interval(kb, nb)
        if not na or not nb:
            st = "too few seeds"
        else:
            st = "regressed" if wb[0] > wa[1] else "improved" if wb[1] < wa[0] else "no change"
        rows.append({**base, "metric": "diverged", "A": f"{ka}/{na} [{wa[0]:.2f}, {wa[1]:.2f}]",
                     "B": f"{kb}/{nb} [{wb[0]:.2f}, {wb[1]:.2f}]", "B - A [95% CI]": f"{kb / max(nb, 1) - ka / max(na, 1):+.2f}",
                     "status": st})
    return pd.DataFrame(rows)


def config_differences(meta_a: dict, meta_b: dict) -> list[str]:
    """``section.key: A -> B`` for every config value that differs between the runs."""
    out = []
    ca, cb = meta_a.get("config", {}), meta_b.get("config", {})
    for section in sorted(set(ca) | set(cb)):
        sa, sb = ca.get(section) or {}, cb.get(section) or {}
        for k in sorted(set(sa) | set(sb)):
            if sa.get(k) != sb.get(k):
                out.append(f"{section}.{k}: {sa.get(k)!r} -> {sb.get(k)!r}")
    return out


def main(args) -> int:
    sa, sb = resolve_run(args.run_a, args.results_dir), resolve_run(args.run_b, args.results_dir)
    da, db = trials_frame(sa), trials_frame(sb)
    for store, df in ((sa, da), (sb, db)):
        if df.empty or "status" not in df:
            raise HarnessError(f"run {str(store.root)!r} has no stored trials to compare")
        if store.meta().get("kind", "train") != "train":
            raise HarnessError(f"run {str(store.root)!r} is a measurement ({store.meta().get('kind')}), not a training "
                               f"run; compare works on training runs")
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    table = compare_frames(da, db, metrics, args.tolerance)
    common = table[~table["status"].isin(["only in A", "only in B"])]
    if common.empty:
        raise HarnessError(f"runs {sa.root.name!r} and {sb.root.name!r} have no variant (x sweep point) in common")
    if not (table["point"] != "").any():
        table = table.drop(columns=["point"])
    print(f"A: {sa.root}\nB: {sb.root}\n")
    diffs = config_differences(sa.meta(), sb.meta())
    if diffs:
        print("config differences (A -> B): " + "; ".join(diffs) + "\n")
    print(to_markdown(table))
    bad = table[table["status"] == "regressed"]
    print()
    if len(bad):
        print(f"REGRESSION: {len(bad)} metric(s) got worse beyond their 95% CI: "
              + "; ".join(f"{r.variant} {r.metric}" for r in bad.itertuples()))
        return 1
    print("no regression beyond the 95% confidence intervals")
    return 0
