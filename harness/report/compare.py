"""Two runs side by side, per variant (x sweep point): the regression test of ``python -m harness
compare`` and :func:`harness.compare` (its rules: docs/statistics.md, and ``python -m harness compare --help``).

:func:`compare_frames` compares two runs' trial frames; :func:`config_differences` their configs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .. import stats
from ..settings import current_view
from ..errors import ConfigError, HarnessError
from ..runmeta import RunMeta
from ..store import RunStore
from ..trial import NO_RESULT
from ..metrics import BUILTIN, COPY_METRICS, Metric, by_name, shown
from .frames import run_metrics, trials_frame

#: The base task's metrics that ``compare`` holds B to (a run's own: its task's, shown in ``compare``).
DEFAULT_METRICS = tuple(m.name for m in shown(COPY_METRICS, "compare"))


def _paired_diff_stat(a, b, axis=-1):
    # IQM of the per-seed differences B - A (the two samples are resampled with the same indices)
    return stats._iqm_axis(b - a)


BROKEN = (*NO_RESULT, "diverged")  #: trial statuses that produced no final metrics (failed, timed out, diverged)


def _by_seed(g: pd.DataFrame, metric: str) -> dict:
    """seed -> finite value of ``metric`` over the finished (status ``ok``) trials of ``g``."""
    ok = g[g["status"] == "ok"]
    v = pd.to_numeric(ok[metric], errors="coerce") if metric in ok else pd.Series(np.nan, index=ok.index)
    return {s: float(x) for s, x in zip(ok["seed"], v) if np.isfinite(x)}


def metric_row(ga: pd.DataFrame, gb: pd.DataFrame, metric: str, tolerance: float = 0.0,
               declared: dict[str, Metric] | None = None) -> dict:
    """One metric of one (variant, point): A, B, the paired difference and the status (``declared``: name ->
    Metric, default the built-in tasks' :data:`harness.metrics.BUILTIN`, gives the direction)."""
    higher = (declared or BUILTIN)[metric].higher_is_better
    da, db = _by_seed(ga, metric), _by_seed(gb, metric)
    seeds = sorted(set(da) & set(db))
    va, vb = np.array([da[s] for s in seeds]), np.array([db[s] for s in seeds])
    ia, ib = stats.iqm_ci(list(da.values())), stats.iqm_ci(list(db.values()))
    d = stats.iqm(vb - va) if seeds else float("nan")
    lo, hi = stats.bootstrap_ci([va, vb], _paired_diff_stat, paired=True)
    if math.isnan(lo):
        status = "too few seeds"
        note = f"{len(seeds)} seed(s) finished in both runs; the paired CI needs >= {stats.MIN_N_FOR_CI}"
    else:
        worse_lo, worse_hi = (-hi, -lo) if higher else (lo, hi)  # oriented so > 0 is worse
        status = ("regressed" if worse_lo > tolerance else
                  "improved" if worse_hi < -tolerance else "no change")
        note = f"IQM of per-seed B - A, paired bootstrap over {len(seeds)} seeds"
    return {"metric": metric, "A": stats.fmt_ci(*ia, 4), "B": stats.fmt_ci(*ib, 4),
            "B - A [95% CI]": stats.fmt_ci(d, lo, hi, 4), "status": status, "note": note}


def _broken(g: pd.DataFrame) -> str:
    nf, nd = int(g["status"].isin(NO_RESULT).sum()), int((g["status"] == "diverged").sum())
    lo, hi = stats.wilson_interval(nf + nd, len(g))
    return f"{nf + nd}/{len(g)} ({nf} failed, {nd} diverged) [{lo:.2f}, {hi:.2f}]"


def failure_row(ga: pd.DataFrame, gb: pd.DataFrame) -> dict:
    """Failed or diverged trials of one (variant, point): the rule in the module docstring.

    A failed trial raised (crash, out of memory); a diverged one stopped at a non-finite loss or
    gradient norm. Both produced no final metrics, so they are judged here, never hidden by
    ``too few seeds`` in the metric rows.
    """
    fail_a = set(ga.loc[ga["status"] == "failed", "seed"])
    failed_b = gb[gb["status"] == "failed"]
    d, lo, hi = stats.rate_difference_ci([gb["status"].isin(BROKEN).to_numpy()],
                                         [ga["status"].isin(BROKEN).to_numpy()])
    new_crash = failed_b[~failed_b["seed"].isin(fail_a)]
    if len(gb) and len(failed_b) == len(gb):
        status, note = "regressed", f"all {len(gb)} trials of B failed"
    elif len(new_crash):
        first = new_crash.iloc[0]
        status = "regressed"
        note = (f"B failed at seed(s) {', '.join(str(s) for s in new_crash['seed'])} where A did not "
                f"(seed {first['seed']}: {str(first.get('reason', '') or '?')[:120]})")
    elif lo > 0:
        status, note = "regressed", "Newcombe 95% CI of rate(B) - rate(A) above 0"
    elif hi < 0:
        status, note = "improved", "Newcombe 95% CI of rate(B) - rate(A) below 0"
    else:
        status, note = "no change", "Newcombe 95% CI of rate(B) - rate(A) contains 0"
    return {"metric": "failed or diverged", "A": _broken(ga), "B": _broken(gb),
            "B - A [95% CI]": f"{d:+.2f} [{lo:+.2f}, {hi:+.2f}] (rate, Newcombe)",
            "status": status, "note": note}


def integrity_row(ga: pd.DataFrame, gb: pd.DataFrame) -> dict:
    """Trials marked ``invalid`` (they failed an integrity probe: a leaking mask, non-finite gradients).
    Any invalid trial in B is a regression, whatever A did: a regression test never passes a candidate whose
    masks leak. Invalid trials never enter the metric rows (only ``ok`` trials do)."""
    ia, ib = ga[ga["status"] == "invalid"], gb[gb["status"] == "invalid"]
    if len(ib):
        first = str(ib.iloc[0].get("reason", "") or "?").split("; ")[0][:160]
        status, note = "regressed", f"B fails the integrity probes (seed {ib.iloc[0]['seed']}: {first})"
    else:
        status, note = "improved", "A's trials failed the integrity probes, B's pass"
    return {"metric": "invalid (integrity probes)", "A": f"{len(ia)}/{len(ga)}", "B": f"{len(ib)}/{len(gb)}",
            "B - A [95% CI]": "—", "status": status, "note": note}


def compare_frames(a: pd.DataFrame, b: pd.DataFrame, metrics=DEFAULT_METRICS, tolerance: float = 0.0,
                   declared: tuple[Metric, ...] | None = None) -> pd.DataFrame:
    """One row per (variant, point, metric) with A, B, the difference, a status and a note.

    Status: ``regressed``, ``improved`` (the CI lies on the better side), ``no change``
    (the CI covers the tolerance band), ``too few seeds`` (a paired CI needs
    :data:`harness.stats.MIN_N_FOR_CI` seeds finished in both runs), ``only in A`` /
    ``only in B``. Every (variant, point) in both runs also gets a ``failed or diverged`` row
    (:func:`failure_row`).

    ``declared``: the metrics the runs' tasks declare (default: the built-in tasks',
    :data:`harness.metrics.BUILTIN`); only those verdicts may use can be compared.

    Raises:
        ConfigError: an unknown metric or a negative tolerance.
    """
    usable = {k: m for k, m in by_name(declared if declared is not None else BUILTIN.values()).items() if m.verdict}
    for m in metrics:
        if m not in usable:
            raise ConfigError(f"unknown metric {m!r} for --metrics; expected names from {', '.join(usable)}")
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
                         "status": "only in A" if key not in keys_b else "only in B", "note": ""})
            continue
        ga = a[(a["variant"] == variant) & (a["point"] == point)]
        gb = b[(b["variant"] == variant) & (b["point"] == point)]
        rows += [{**base, **metric_row(ga, gb, m, tolerance, usable)} for m in metrics]
        rows.append({**base, **failure_row(ga, gb)})
        if (ga["status"] == "invalid").any() or (gb["status"] == "invalid").any():
            rows.append({**base, **integrity_row(ga, gb)})
    return pd.DataFrame(rows)


def config_differences(meta_a: RunMeta, meta_b: RunMeta) -> list[str]:
    """``section.key: A -> B`` for every config value that differs between the runs, each config read
    as this code reads it (:func:`harness.settings.current_view`): a run stored before ``model.window``
    existed does not differ from one with ``window`` 0, nor an old record's ``train.lr`` from ``train.noam_factor``."""
    out = []
    ca, cb = current_view(meta_a.config), current_view(meta_b.config)
    for section in sorted(set(ca) | set(cb)):
        sa, sb = ca.get(section) or {}, cb.get(section) or {}
        for k in sorted(set(sa) | set(sb)):
            if sa.get(k) != sb.get(k):
                out.append(f"{section}.{k}: {sa.get(k)!r} -> {sb.get(k)!r}")
    return out


@dataclass
class CompareOutcome:
    """Two runs compared (:func:`compare_runs`).

    Attributes:
        run_a, run_b: the reference and the candidate run.
        table: one row per (variant, [point,] metric): ``A``, ``B``, ``B - A [95% CI]``,
            ``status`` (``regressed``, ``improved``, ``no change``, ``too few seeds``, ``only in A``,
            ``only in B``) and ``note`` (:func:`compare_frames`; no ``point`` column when nothing is swept).
        config_differences: ``section.key: A -> B`` for every config value that differs.
    """

    run_a: RunStore
    run_b: RunStore
    table: pd.DataFrame
    config_differences: list[str]

    @property
    def regressed(self) -> pd.DataFrame:
        """The rows whose status is ``regressed``."""
        return self.table[self.table["status"] == "regressed"]

    @property
    def ok(self) -> bool:
        """Nothing regressed."""
        return self.regressed.empty

    @property
    def exit_code(self) -> int:
        """1 when anything regressed, else 0 (``python -m harness compare``)."""
        return 0 if self.ok else 1

    def verdict(self) -> str:
        """One line: which rows regressed, or that none did."""
        if self.ok:
            return ("no regression: no metric worse beyond its 95% CI, no new failed or diverged trials beyond "
                    "the rule")
        return (f"REGRESSION: {len(self.regressed)} row(s) regressed (see the status and note columns): "
                + "; ".join(f"{r.variant}{' @ ' + r.point if getattr(r, 'point', '') else ''} {r.metric}"
                            for r in self.regressed.itertuples()))


def compare_runs(store_a: RunStore, store_b: RunStore, metrics=None, tolerance: float = 0.0) -> CompareOutcome:
    """Compare the reference run ``store_a`` with the candidate ``store_b``, per variant (x sweep
    point): the regression test of ``python -m harness compare``.

    Args:
        metrics: the metrics to compare (names the runs' tasks declare for verdicts); None: those both tasks
            show in ``compare`` (:attr:`harness.metrics.Metric.show`) and both runs recorded: ``heldout_ce``
            and ``exact_match``, plus ``wer`` and ``per`` for g2p.
        tolerance: a difference must exceed it (absolute, in the metric's unit) beyond its CI.

    Raises:
        HarnessError: a run without stored trials, a measurement run, no variant (x point) in
        common; ConfigError: an unknown metric or a negative tolerance.
    """
    da, db = trials_frame(store_a), trials_frame(store_b)
    for store, df in ((store_a, da), (store_b, db)):
        if df.empty or "status" not in df:
            raise HarnessError(f"run {str(store.root)!r} has no stored trials to compare")
        kind = store.meta().kind
        if kind != "train":
            raise HarnessError(f"run {str(store.root)!r} is a measurement ({kind}), not a training "
                               f"run; compare works on training runs")
    declared = run_metrics(store_a.meta()) + run_metrics(store_b.meta())
    if metrics is None:  # the metrics both runs' tasks show in compare and both runs recorded (g2p: + WER, PER)
        names_b = {m.name for m in shown(run_metrics(store_b.meta()), "compare")}
        metrics = [m.name for m in shown(run_metrics(store_a.meta()), "compare")
                   if m.name in names_b and m.name in da and m.name in db]
    table = compare_frames(da, db, list(metrics), tolerance, declared)
    common = table[~table["status"].isin(["only in A", "only in B"])]
    if common.empty:
        raise HarnessError(f"runs {store_a.root.name!r} and {store_b.root.name!r} have no variant (x sweep point) "
                           f"in common")
    if not (table["point"] != "").any():
        table = table.drop(columns=["point"])
    return CompareOutcome(store_a, store_b, table, config_differences(store_a.meta(), store_b.meta()))
