"""The report of a run made from an experiment (or of any run): :func:`write_run_report`, and the
table the command line shows instead of the results table (:func:`run_table`)."""
from __future__ import annotations

from pathlib import Path

from ..overview import overview_sections
from ..report import trials_frame, write_report
from ..report.peers import peer_sections
from ..store import RunStore
from .grad_norm import slope_table, write_measurement_run_report
from .parse import spec_from_meta
from .render import report_sections


def write_run_report(store: RunStore, baseline: str | None = None, metric: str | None = None) -> Path:
    """:func:`harness.report.write_report` with the sections of the experiment the run was made
    from (none for a plain run) and, where the run folder holds ``peers.csv``, the peers beside its variants
    (:mod:`harness.report.peers`); a measurement experiment (``kind`` other than ``train``) gets
    its own report (:func:`harness.experiments.grad_norm.write_measurement_report`).

    Args:
        store: the run.
        baseline: compared against (default: the experiment's, else as :func:`harness.report.resolve_baseline`).
        metric: comparison metric (default: the experiment's, else the task's primary metric).

    Returns:
        The path of ``report.md``.

    Raises:
        StoreError: unreadable ``config.json``.  ConfigError: a metric the task does not declare for verdicts.
    """
    meta = store.meta()
    spec = spec_from_meta(meta)
    if spec is None:
        return write_report(store, baseline=baseline, metric=metric, sections=overview_sections(meta) + peer_sections(store))
    if spec.kind != "train":
        return write_measurement_run_report(store)
    return write_report(store, baseline=baseline or spec.baseline, metric=metric or spec.metric,
                        sections=overview_sections(meta) + peer_sections(store) + report_sections(spec), title=f"Experiment `{spec.name}`")


def run_table(store: RunStore):
    """The table to show for the run instead of its report's results table: a measurement
    experiment's slope table (:func:`harness.experiments.grad_norm.slope_table`), None for a
    training run (``RunOutcome.table``).

    Raises:
        StoreError: unreadable ``config.json``.
    """
    spec = spec_from_meta(store.meta())
    if spec is None or spec.kind == "train":
        return None
    return slope_table(trials_frame(store), spec)
