"""Reports: per-variant statistics across seeds, pandas tables via tabulate, matplotlib plots.

:func:`aggregate` computes, per variant (and sweep point), the statistics the report shows as
typed :class:`SummaryRow` records (definitions in :mod:`harness.stats`, :mod:`.rows` and
``docs/statistics.md``); :func:`summary_table`
formats them; :func:`write_report` renders ``report.md`` with its PNG figures from what a run
stored, so ``python -m harness report RUN`` can re-render it at any time. Reporting depends on
nothing above it: a caller adds sections (an experiment's claims, its failure analysis) by
passing :class:`Section` objects to :func:`write_report`.

Modules: :mod:`.frames` (loading and ordering), :mod:`.rows` (the typed rows, "same function"),
:mod:`.tables` (statistics and tables),
:mod:`.plots` (matplotlib figures), :mod:`.writer` (``report.md`` and its sections), :mod:`.partial`
(the banner of a partial run), :mod:`.terminal` (the results table in at most 120 columns).

Main table columns (one row per variant x sweep point, the baseline first, as Narang et al.
2021 Table 1): params; step time (median ms per optimiser step, evaluation excluded); early
loss (mean ± std of the mean training loss over the first 10 steps); final held-out
cross-entropy and exact-match (IQM [95 % stratified-bootstrap CI] over the runs that finished);
steps to exact-match >= 0.99 (median [IQR], unsolved and diverged runs count as ∞);
diverged x/n [Wilson 95 %]; P(variant > baseline) [95 % Wilson score interval] over paired
seeds on the comparison metric; the verdict with the test and numbers behind it
(:data:`harness.stats.RULE_TEXT`), or ``=`` and "same function" for a variant that ``check``
proves computes the baseline's function (:data:`SAME_FUNCTION_TEXT`).
"""
from __future__ import annotations

from .frames import (DEFAULT_METRIC, METRICS, SLOT_COLS, TRAINED, baseline_note, choose_baseline, curves_frame,
                     invalid_variants, point_order, resolve_baseline, run_metrics, run_primary, trials_frame, variant_order, verdict_metric)
from .plots import (MAX_OVERLAID, log_axis, min_span_limits, plot_curves,
                    plot_curves_grid, plot_final_metrics, plot_steps_to_solve)
from .partial import partial_banner, partial_counts
from .rows import (SAME_FUNCTION, SAME_FUNCTION_TEXT, Count, Interval, MeanStd, MedianIQR, SummaryRow,
                   recorded_classes, same_class, training_classes)
from .tables import (aggregate, caption, comparison_cells, environment_block, lr_max, paired_values,
                     same_function_variants, summary_table, sweep_table, to_markdown, variants_table)
from .terminal import terminal_table
from .writer import POSITIONS, ReportContext, Section, invalid_section, unreadable_section, write_report

__all__ = [
    "DEFAULT_METRIC", "MAX_OVERLAID", "METRICS", "POSITIONS", "SAME_FUNCTION", "SAME_FUNCTION_TEXT", "SLOT_COLS",
    "TRAINED", "Count", "Interval", "MeanStd", "MedianIQR", "ReportContext", "Section", "SummaryRow",
    "aggregate", "baseline_note", "caption", "choose_baseline", "comparison_cells", "curves_frame", "environment_block", "invalid_section",
    "invalid_variants", "log_axis", "lr_max", "min_span_limits", "paired_values", "partial_banner", "partial_counts",
    "recorded_classes", "same_class", "training_classes",
    "same_function_variants", "plot_curves", "plot_curves_grid", "plot_final_metrics",
    "plot_steps_to_solve", "point_order", "resolve_baseline", "run_metrics", "run_primary", "summary_table", "sweep_table", "terminal_table",
    "to_markdown",
    "trials_frame", "unreadable_section", "variant_order", "variants_table", "verdict_metric", "write_report",
]
