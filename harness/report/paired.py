"""The report's "Paired seeds on every metric" section: each variant's wins and losses against the
baseline, seed by seed, on every metric of the main table, beside the one the verdicts use.

A verdict rests on one metric, the task's primary one or ``--metric``, chosen before the run. The
other metrics can agree with it or tell another story (on g2p the models without the x sqrt(d_model)
scale tied on WER, 7-9, while their mean held-out CE over training was worse in 15 of 16 pairs:
``results/reference/gpu-h200-run5``), and a reader should see that without reading trial files. These
counts are descriptive: with k metrics one of them reaches p < 0.05 by chance far more often than 1
time in 20, so a count here is a lead for a new run planned around that metric, not a claim; the
section says so, with the Bonferroni threshold 0.05 / k.

Pairs: the seeds both variants have at a sweep point (:func:`harness.report.tables.paired_values`: a
failed trial left out, a diverged one the worst score); wins and losses from
:func:`harness.stats.paired_outcomes` in the metric's direction, p from the exact two-sided sign test
(:func:`harness.stats.sign_test_p`, ties dropped). Variants that ``check`` put in the baseline's class
compute the same function: their differences are rounding, so they get no counts. Timings (metrics in
seconds) are left out: they measure the machine, not the variant.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..metrics import Metric, shown
from ..stats import ALPHA, paired_outcomes, sign_test_p
from .frames import invalid_variants, point_order, run_metrics, variant_order
from .rows import recorded_classes, same_class
from .tables import paired_values, to_markdown

#: Fewest paired seeds for the section to appear (one pair says nothing either way).
MIN_PAIRS = 2


def section_metrics(meta, df) -> list[Metric]:
    """The main table's metrics that the section counts: shown in the table, recorded in the trials,
    not a timing (unit ``s``)."""
    return [m for m in shown(run_metrics(meta), "table") if m.unit != "s" and m.name in df]


def paired_cell(df, variant: str, baseline: str, point: str, metric: Metric) -> tuple[str, int]:
    """``"W-L, p"`` (``"W-L-T, p"`` with ties) of ``variant`` against ``baseline`` on ``metric``, and the
    number of pairs; ``"—"`` where no pair has a value."""
    a, b, _ = paired_values(df, variant, baseline, point, metric.name)
    if not len(a) or (np.isnan(a) & np.isnan(b)).all():
        return "—", 0
    w, l, t = paired_outcomes(a, b, metric.higher_is_better)
    counts, p = f"{w}-{l}" + (f"-{t}" if t else ""), sign_test_p(w, l)
    return f"{counts}, p {'< 0.001' if p < 0.001 else f'{p:.3f}'}", len(a)


def paired_lines(ctx) -> list[str]:
    """The section's markdown lines (a :class:`harness.report.writer.ReportContext`); [] without a baseline,
    without two metrics to show or with fewer than :data:`MIN_PAIRS` pairs anywhere."""
    meta, df, baseline, verdict = ctx.meta, ctx.df, ctx.baseline, ctx.metric
    if baseline is None or not len(df):
        return []
    metrics = section_metrics(meta, df)
    if len(metrics) < 2:
        return []
    classes, rows, most = recorded_classes(meta), [], 0
    sweep = df["point"].nunique() > 1
    invalid = set(invalid_variants(df))
    for point in point_order(df, meta):
        for variant in variant_order(df, baseline, meta):
            if variant == baseline or same_class(classes, variant, baseline):
                continue
            label = f"{variant} (invalid: no verdict)" if variant in invalid else variant
            row = {"variant": label} | ({"point": point} if sweep else {})
            for m in metrics:
                row[_header(m, verdict)], n = paired_cell(df, variant, baseline, point, m)
                most = max(most, n)
            rows.append(row)
    if not rows or most < MIN_PAIRS:
        return []
    k = len(metrics)
    return ["## Paired seeds on every metric", "",
            f"Wins-losses(-ties) of each variant against `{baseline}` over the paired seeds, in each metric's "
            f"direction, with the exact two-sided sign test's p (ties dropped). The verdicts above rest on "
            f"**{verdict}** alone; the other columns are descriptive: with {k} metrics one of them reaches "
            f"p < {ALPHA:g} by chance far more often than 1 time in 20 (Bonferroni: p < {ALPHA / k:.3f}), so "
            f"read a count here as a lead for a new run planned around that metric, not as a claim. Variants "
            f"that check puts in `{baseline}`'s class are left out (their differences are rounding)"
            + ("; an invalid variant's counts are descriptive only, whatever its verdict column says." if invalid
               else "."), "",
            to_markdown(pd.DataFrame(rows)), ""]


def _header(metric: Metric, verdict: str) -> str:
    return metric.name + (" (verdict)" if metric.name == verdict else "")
