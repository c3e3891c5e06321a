"""Reports: per-variant statistics across seeds, pandas tables via tabulate, matplotlib plots.

:func:`aggregate` computes, per variant (and sweep point), the statistics the report shows
(definitions in :mod:`harness.stats` and ``docs/statistics.md``); :func:`summary_table`
formats them; :func:`write_report` renders ``report.md`` with its PNG figures from what a run
stored, so ``python -m harness report RUN`` can re-render it at any time. Reporting depends on
nothing above it: a caller adds sections (an experiment's claims, its failure analysis) by
passing :class:`Section` objects to :func:`write_report`.

Modules: :mod:`.frames` (loading and ordering), :mod:`.tables` (statistics and tables),
:mod:`.plots` (matplotlib figures), :mod:`.writer` (``report.md`` and its sections).

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

from .frames import (DEFAULT_METRIC, METRICS, SLOT_COLS, TRAINED, curves_frame, invalid_variants, point_order,
                     resolve_baseline, trials_frame, variant_order)
from .plots import (MAX_OVERLAID, _colors, _plt, log_axis, plot_curves, plot_curves_grid,  # noqa: F401
                    plot_final_metrics, plot_steps_to_solve)
from .tables import (aggregate, caption, environment_block, lr_max, paired_values, summary_table, sweep_table,
                     to_markdown, variants_table)
# _plt and _colors (matplotlib on first use, a palette) stay importable from here: main's
# harness/suite_report.py imports ``from .report import _plt``.
from .writer import POSITIONS, ReportContext, Section, invalid_section, unreadable_section, write_report

__all__ = [
    "DEFAULT_METRIC", "MAX_OVERLAID", "METRICS", "POSITIONS", "SLOT_COLS", "TRAINED", "ReportContext", "Section",
    "aggregate", "caption", "curves_frame", "environment_block", "invalid_section", "invalid_variants",
    "log_axis", "lr_max", "paired_values", "plot_curves", "plot_curves_grid", "plot_final_metrics",
    "plot_steps_to_solve", "point_order", "resolve_baseline", "summary_table", "sweep_table", "to_markdown",
    "trials_frame", "unreadable_section", "variant_order", "variants_table", "write_report",
]
