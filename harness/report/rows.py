"""Typed records of the report's statistics: one :class:`SummaryRow` per (variant, sweep point).

:func:`harness.report.aggregate` returns these; the report's tables and plots, the suite
(:mod:`harness.suite`), the experiments' claims and the Python API's ``summary`` frame read their
attributes. Each interval-like field is a small frozen record that also unpacks as the tuple it
replaces (``value, low, high = row.heldout_ce``), so ``stats.fmt_ci(*row.heldout_ce)`` keeps working.
Nothing here is stored: ``trials.csv``, ``curves.csv`` and ``suite.csv`` are unchanged.

Same function: ``check`` (:mod:`harness.checks`) groups variants into equivalence classes (same
outputs and gradients from the same canonical weights, CPU fp32); ``run`` records them in
``config.json`` under ``check`` (:func:`harness.overview.check_classes`). A variant in the
baseline's class computes the same function as the baseline, so its training differs from the
baseline's only by floating-point rounding: the report shows it as "same function", never as a
probability or a verdict (:attr:`SummaryRow.same_function`). That needs the same start too: a variant
with another ``init`` scheme is compared like any other (:func:`training_classes`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Iterator

from ..metrics import COPY_METRICS
from ..stats import Comparison
from ..runmeta import RunMeta

#: trial-row column -> :class:`SummaryRow` field, where the names differ.
FIELDS = {"heldout_token_acc": "token_acc"}
#: The shared metrics (every task's training loop records them): their summaries are :class:`SummaryRow` fields.
_CORE = tuple(m.name for m in COPY_METRICS)

SAME_FUNCTION = "same function"  #: the verdict of a variant in the baseline's check class

#: The report legend's definition of "same function" (tables, suite and plots say the same).
SAME_FUNCTION_TEXT = (
    "**same function**: `check` (CPU, fp32, recorded in `config.json` under `check` at the run's start) puts the "
    "variant in the baseline's equivalence class: the same outputs and gradients from the same weights. Its "
    "training differs from the baseline's only by floating-point rounding (operation order), so it gets no "
    "P(> baseline) and no verdict, whatever the seeds show; `=` stands in the probability column.")


class _Unpacks:
    """Unpacks like the tuple it replaced (``value, low, high = row.heldout_ce``), fields in order."""

    def __iter__(self) -> Iterator[float]:
        return iter(tuple(getattr(self, f.name) for f in fields(self)))


@dataclass(frozen=True)
class Interval(_Unpacks):
    """A point estimate with its 95 % interval (IQM with a stratified-bootstrap CI, Agarwal et al. 2021).

    Args:
        value: the point estimate, in the metric's unit (nan: no data).
        low, high: the interval's bounds (nan: too few values for a CI).
    """

    value: float
    low: float
    high: float


@dataclass(frozen=True)
class MeanStd(_Unpacks):
    """Mean ± standard deviation over seeds (early loss, Narang et al. 2021)."""

    mean: float
    std: float


@dataclass(frozen=True)
class MedianIQR(_Unpacks):
    """Median with the interquartile range over seeds; ``inf`` stands for "not solved"."""

    median: float
    q1: float
    q3: float


@dataclass(frozen=True)
class Count(_Unpacks):
    """``k`` of ``n`` trials with a 95 % Wilson score interval of the rate ``k / n``."""

    k: int
    n: int
    low: float
    high: float


@dataclass(frozen=True)
class SummaryRow:
    """The statistics of one (variant, sweep point) across seeds (definitions: ``docs/statistics.md``).

    Attributes:
        variant, point: the series (``point`` "" without a sweep).
        n, n_ok, n_failed: trials that ran (not raised), that trained (``ok``/``diverged``), that raised.
        params: unique parameters (None when not recorded).
        step_ms: median wall time of one optimiser step, ms.  tokens_per_s: median label tokens/s.
        early_loss: mean training loss of the first 10 steps, mean ± std over seeds (nats/token).
        heldout_auc, heldout_ce: mean held-out CE over training and final held-out CE (nats/token), IQM [CI].
        exact_match, token_acc: held-out exact-match and token accuracy (fractions), IQM [CI].
        steps_to_solve: steps to held-out exact-match >= 0.99, median [IQR] (inf: not solved).
        time_to_solve_s: training seconds to that point, median (inf: not solved by half the seeds).
        solved: seeds that got there.  diverged: diverged trials of ``n`` with a Wilson interval.
        slots: slot -> component of the variant.
        comparison: the paired comparison with the baseline (None: the baseline itself, an invalid
            variant or baseline, no paired seed). Kept for a same-function variant too, as the
            negative control's raw test; :attr:`verdict` is what a reader is told.
        invalid: the integrity probes the variant failed (empty when valid).
        baseline_invalid: the baseline failed one (no comparison is drawn).
        same_function: ``check`` proves the variant computes the baseline's function (module docstring).
        extra: the IQM [CI] of each metric the task declares beyond the fields above (``g2p``: ``wer``
            and ``per``; a plugin task's own), by name; :meth:`value` reads any metric by name.
    """

    variant: str
    point: str
    n: int
    n_ok: int
    n_failed: int
    params: int | None
    step_ms: float
    tokens_per_s: float
    early_loss: MeanStd
    heldout_auc: Interval
    heldout_ce: Interval
    exact_match: Interval
    token_acc: Interval
    steps_to_solve: MedianIQR
    time_to_solve_s: float
    solved: int
    diverged: Count
    slots: dict = field(default_factory=dict)
    comparison: Comparison | None = None
    invalid: list = field(default_factory=list)
    baseline_invalid: bool = False
    same_function: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def wer(self) -> Interval | None:
        """``g2p``'s held-out word error rate, IQM [CI] (None: a task without it)."""
        return self.extra.get("wer")

    @property
    def per(self) -> Interval | None:
        """``g2p``'s held-out phoneme error rate, IQM [CI] (None: a task without it)."""
        return self.extra.get("per")

    def value(self, metric: str):
        """The summary of the metric called ``metric`` (a trial-row column): an :class:`Interval`, a
        :class:`MeanStd`, a :class:`MedianIQR` or a float (its :attr:`harness.metrics.Metric.stat`); None
        when the row has none."""
        if metric in self.extra:
            return self.extra[metric]
        return getattr(self, FIELDS.get(metric, metric), None) if metric in _CORE else None

    @property
    def verdict(self) -> str | None:
        """``"same function"``, the comparison's verdict, or None (baseline, invalid, nothing paired)."""
        if self.invalid or self.baseline_invalid:
            return None
        if self.same_function:
            return SAME_FUNCTION
        return self.comparison.verdict if self.comparison is not None else None


def same_class(classes: list[list[str]] | None, a: str, b: str | None) -> bool:
    """True when ``a`` and ``b`` are distinct and in one of check's equivalence ``classes``."""
    if not b or a == b or not classes:
        return False
    return any(a in c and b in c for c in classes)


def training_classes(check: dict | None) -> list[list[str]]:
    """Check's classes (``check["classes"]``, as :func:`harness.overview.check_classes` records them) split by each
    variant's ``init`` scheme (``check["starts"]``; a record without it is not split): two variants whose trainings
    differ only by rounding compute the same function *and* start from the same weights. A change of ``init``
    alone is the same function at equal weights, yet trains from another start: it is compared, never called
    "same function". [] when nothing was recorded."""
    check = check or {}
    classes, starts = check.get("classes"), check.get("starts") or {}
    if not isinstance(classes, list):
        return []
    out: list[list[str]] = []
    for c in (c for c in classes if isinstance(c, (list, tuple))):
        split: dict[str, list[str]] = {}
        for name in c:
            split.setdefault(str(starts.get(name, "")), []).append(name)
        out += list(split.values())
    return out


def recorded_classes(meta: RunMeta | None) -> list[list[str]]:
    """The classes whose trainings differ only by rounding, from the check a run recorded in ``config.json`` (key
    ``check``): :func:`training_classes`; [] when none (``--no-check``, a check that could not run, a run from
    before check was recorded)."""
    return training_classes(meta.check if meta else None)
