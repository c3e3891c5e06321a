"""What a task's trials are scored on: the :class:`Metric` record and the built-in declarations.

A task lists its metrics in :attr:`harness.tasks.base.Task.metrics` (in the order the report
shows them) and names the one its verdicts use by default in ``Task.primary_metric``. Every table
of metrics derives from these declarations: the report's main table, caption and final-metrics
plot (:mod:`harness.report`), ``compare``'s default metrics, the suite's metrics, TensorBoard's
``final/`` scalars, the metrics a trial copies from its task's evaluation into its row
(:func:`row_values`) and the names ``--metric`` / an experiment's ``metric`` accept. A metric's
value is a column of the trial row (``trials.csv``) with the metric's name, filled from the dict
that :meth:`harness.tasks.base.Task.evaluate` returns.

Splits: the metric columns are the test set's numbers, scored once after training; the dev set's
numbers sit beside them under :func:`dev_column` names (``dev_ce``, ``dev_exact_match``, ``dev_wer``),
and the curve's evaluation rows, the "solved" step and every selection read the dev set only
(:mod:`harness.tasks.splits`, ``docs/tasks.md``).

This module is at the bottom of the layers (no torch, no registry): tasks import it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

#: Where a metric may be shown: ``table`` the report's main table, ``plot`` the final-metrics figure,
#: ``compare`` the default metrics of ``python -m harness compare``, ``suite`` a suite's comparison
#: metric, ``tensorboard`` a ``final/<name>`` scalar (``--tensorboard``).
PLACES = ("table", "plot", "compare", "suite", "tensorboard")
#: How the report summarises a metric over seeds: ``iqm`` the IQM with a 95 % stratified-bootstrap CI,
#: ``mean_std`` mean ± std, ``median_iqr`` median [IQR] (inf = never reached), ``median`` the median.
STATS = ("iqm", "mean_std", "median_iqr", "median")


@dataclass(frozen=True)
class Metric:
    """One number a trial is scored on: a column of the trial row named :attr:`name`.

    Attributes:
        name: the trial-row column (a Python identifier), e.g. ``"wer"``; what ``--metric`` takes.
        higher_is_better: the direction (True: larger is better).
        unit: the unit, e.g. ``"nats/token"``, ``"fraction"``, ``"steps"``.
        text: one line saying what it measures (the report's caption, ``--metric``'s help, the suite).
        column: the report's main-table header ("" : ``name``).
        show: the places (:data:`PLACES`) that show it.
        verdict: whether verdicts (P(A > B), the sign test, ``compare``) may use it.
        stat: how the report summarises it over seeds (:data:`STATS`).
        is_core: computed by every task's shared training loop (``train.py``), not copied from the
            task's evaluation (:func:`row_values` skips it).

    Raises:
        ValueError: a name that is not an identifier, an unknown place or statistic.
    """

    name: str
    higher_is_better: bool
    unit: str
    text: str
    column: str = ""
    show: tuple[str, ...] = ("table", "plot", "compare", "suite", "tensorboard")
    verdict: bool = True
    stat: str = "iqm"
    is_core: bool = False

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"metric name {self.name!r} must be a Python identifier (a trial-row column)")
        bad = [p for p in self.show if p not in PLACES]
        if bad:
            raise ValueError(f"metric {self.name!r}: unknown place(s) {', '.join(map(repr, bad))}; "
                             f"expected some of {', '.join(PLACES)}")
        if self.stat not in STATS:
            raise ValueError(f"metric {self.name!r}: stat {self.stat!r} is not one of {', '.join(STATS)}")
        if not self.is_core and self.stat != "iqm":
            raise ValueError(f"metric {self.name!r}: a task's own metric is summarised by its IQM (stat 'iqm'), "
                             f"got {self.stat!r}")

    @property
    def label(self) -> str:
        """``text (unit)``: the metric said in full."""
        return f"{self.text} ({self.unit})"

    @property
    def direction(self) -> str:
        """``"higher"`` or ``"lower"`` (is better)."""
        return "higher" if self.higher_is_better else "lower"

    @property
    def header(self) -> str:
        """The report's main-table header."""
        return self.column or self.name


def _m(name, higher, unit, text, **kw) -> Metric:
    return Metric(name, higher, unit, text, is_core=True, **kw)


#: The metrics every task's training loop records (:func:`harness.train.train` and the shared
#: evaluation of :func:`harness.tasks.base.evaluate`), in the report's column order.
TIME_TO_SOLVE = _m("time_to_solve_s", False, "s", "training seconds until dev exact-match >= 0.99",
                   column="time to EM≥0.99 s (median)", show=("table",), verdict=False, stat="median")
EARLY_LOSS = _m("early_loss", False, "nats/token", "early training loss (mean of the first 10 steps)",
                column="early loss (mean ± std)", show=("table",), stat="mean_std")
HELDOUT_AUC = _m("heldout_auc", False, "nats/token", "mean dev cross-entropy over training",
                 column="mean held-out CE over training IQM [95% CI]", show=("table", "tensorboard"), verdict=False)
HELDOUT_CE = _m("heldout_ce", False, "nats/token", "test-set cross-entropy, unsmoothed",
                column="held-out CE IQM [95% CI]")
EXACT_MATCH = _m("exact_match", True, "fraction of sequences", "test-set exact-match",
                 column="exact-match IQM [95% CI]")
TOKEN_ACC = _m("heldout_token_acc", True, "fraction of tokens", "test-set token accuracy (teacher forcing)",
               show=("tensorboard",))
FINAL_TRAIN_LOSS = _m("final_train_loss", False, "nats/token", "final training loss, label-smoothed",
                      show=("tensorboard",))
STEPS_TO_SOLVE = _m("steps_to_solve", False, "steps", "steps to dev exact-match >= 0.99",
                    column="steps to EM≥0.99 median [IQR]", show=("table", "tensorboard"), stat="median_iqr")

#: The base task's metrics (copy, reverse, sort, ...), in the report's column order.
COPY_METRICS: tuple[Metric, ...] = (TIME_TO_SOLVE, EARLY_LOSS, HELDOUT_AUC, HELDOUT_CE, EXACT_MATCH, TOKEN_ACC,
                                    FINAL_TRAIN_LOSS, STEPS_TO_SOLVE)
#: The base task's primary metric: its verdicts compare held-out cross-entropy.
COPY_PRIMARY = "heldout_ce"
#: Columns that only a task solved by exact match can fill: a task whose exact match never nears 1
#: (``g2p``) leaves them out of its :attr:`harness.tasks.base.Task.metrics`.
SOLVE_METRICS = ("time_to_solve_s", "steps_to_solve")

_DECODING = "free-running decoding"
#: The ``g2p`` task's error rates (:mod:`harness.tasks.g2p`), declared here so that tables need no torch.
WER = Metric("wer", False, "fraction of words",
             f"word error rate: share of held-out words whose decoded pronunciation matches none of the word's "
             f"reference pronunciations, {_DECODING}",
             column="WER IQM [95% CI]")
PER = Metric("per", False, "edits / reference phonemes",
             f"phoneme error rate: Levenshtein distance to the closest reference, summed over words, / the summed "
             f"length of those references, {_DECODING}",
             column="PER IQM [95% CI]")
G2P_METRICS: tuple[Metric, ...] = tuple(m for m in COPY_METRICS if m.name not in SOLVE_METRICS) + (WER, PER)
#: The ``text`` task's bits per character (:mod:`harness.tasks.text`; Shannon 1951): its held-out CE / ln 2.
BPC = Metric("bpc", False, "bits/character", "test-set cross-entropy in bits per character (heldout_ce / ln 2)",
             column="bpc IQM [95% CI]")
#: ``text``'s metrics: no exact match of a whole window, nor the steps or time to reach it; bpc added.
TEXT_METRICS: tuple[Metric, ...] = tuple(m for m in COPY_METRICS
                                         if m.name not in SOLVE_METRICS + ("exact_match",)) + (BPC,)

#: name -> Metric of every built-in task's metrics (what a run of a built-in task can be compared on).
BUILTIN: dict[str, Metric] = {m.name: m for m in COPY_METRICS + G2P_METRICS + TEXT_METRICS}


def by_name(metrics: Iterable[Metric]) -> dict[str, Metric]:
    """name -> Metric, in order (the first declaration of a name wins)."""
    out: dict[str, Metric] = {}
    for m in metrics:
        out.setdefault(m.name, m)
    return out


def verdict_names(metrics: Iterable[Metric]) -> list[str]:
    """The names of the metrics verdicts may use, in order."""
    return [m.name for m in metrics if m.verdict]


def shown(metrics: Iterable[Metric], place: str) -> list[Metric]:
    """The metrics shown at ``place`` (one of :data:`PLACES`), in order."""
    return [m for m in metrics if place in m.show]


def row_values(metrics: Iterable[Metric], evaluation: Mapping) -> dict:
    """The task-specific metrics (not :attr:`Metric.is_core`) present in an evaluation's dict, for the
    trial row: ``{"wer": 0.31, "per": 0.07}`` for ``g2p``, ``{}`` for the copy task."""
    return {m.name: evaluation[m.name] for m in metrics if not m.is_core and m.name in evaluation}


#: Metrics read off the dev set's evaluations during and after training (the curve, "solved"); the other metrics
#: of a task are the test set's, but for the training losses :data:`FROM_TRAINING`.
FROM_DEV = ("heldout_auc", "steps_to_solve", "time_to_solve_s")
FROM_TRAINING = ("early_loss", "final_train_loss")
#: The keys every :meth:`harness.tasks.base.Task.evaluate` returns (its task's own metrics come beside them).
EVAL_KEYS = ("heldout_ce", "heldout_token_acc", "exact_match")
#: The ``split`` of a curve's evaluation rows: ``dev`` (periodic and final dev evaluations); ``heldout`` in runs
#: stored before the dev split (periodic probes drawn like the test set, then the final test evaluation).
DEV_SPLIT = "dev"
EVAL_SPLITS = (DEV_SPLIT, "heldout")


def dev_column(name: str) -> str:
    """The trial-row column of a metric's dev value: ``dev_`` + the name without its ``heldout_`` prefix
    (``heldout_ce`` -> ``dev_ce``, ``exact_match`` -> ``dev_exact_match``, ``wer`` -> ``dev_wer``)."""
    return "dev_" + name.removeprefix("heldout_")


def dev_values(metrics: Iterable[Metric], evaluation: Mapping) -> dict:
    """The dev evaluation's numbers for the trial row, under :func:`dev_column` names: the shared
    :data:`EVAL_KEYS` and the task's own metrics present in ``evaluation`` (as :func:`row_values` copies them)."""
    names = list(EVAL_KEYS) + [m.name for m in metrics if not m.is_core]
    return {dev_column(k): evaluation[k] for k in names if k in evaluation}
