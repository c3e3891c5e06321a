"""Aggregation across seeds: robust point estimates, bootstrap intervals and verdicts.

Everything a report says about "A versus B" goes through this module, so that every table
uses the same definitions (stated in ``docs/statistics.md``):

* **IQM** (interquartile mean): the mean of the middle 50 % of the runs,
  ``scipy.stats.trim_mean(x, 0.25)`` -- robust to an outlier seed, more efficient than the
  median (Agarwal et al. 2021, rliable).
* **Stratified bootstrap CI**: percentile bootstrap that resamples runs *within* each stratum
  (a stratum is one task or sweep point) and recomputes the statistic on the pooled resample
  (Agarwal et al. 2021). With one stratum it is the ordinary percentile bootstrap over seeds.
  Implemented with ``scipy.stats.bootstrap`` (several unpaired samples = strata).
* **P(A > B)**, the probability of outperforming (Bouthillier et al. 2021 §4.1): the fraction
  of *paired* runs (same seed: same data order, same canonical initial weights) in which A
  scores better than B, ties counting 1/2; 95 % percentile-bootstrap CI over the pairs.
* **Verdict** from that CI with gamma = 0.75: ``better`` when CI_low > 0.5 and CI_high > 0.75,
  ``worse`` when CI_high < 0.5 and CI_low < 0.25, ``equivalent`` when the CI lies inside
  [0.25, 0.75], otherwise ``no claim``; and always ``no claim`` below :data:`MIN_PAIRS_FOR_CLAIM`
  paired seeds.
* **Wilson interval** for a count x/n (diverged runs, failure rates): ``scipy.stats.binomtest``;
  a difference of two rates gets Newcombe's hybrid score interval built from two Wilson intervals.

All functions take plain sequences (lists, numpy arrays, pandas Series) and return floats;
an interval that cannot be computed (too few values) is ``(nan, nan)``. Bootstrap results
are reproducible: the generator is seeded with :data:`BOOTSTRAP_SEED`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np


class _LazyScipyStats:
    """``scipy.stats`` imported on first use: it costs ~1.4 s, and every CLI command imports
    this module while only reports need it."""

    def __getattr__(self, name):
        from scipy import stats

        return getattr(stats, name)


_st = _LazyScipyStats()

CONFIDENCE = 0.95  #: two-sided confidence level of every interval
N_RESAMPLES = 10_000  #: bootstrap replicates (rliable's examples use 50,000; 10,000 keeps reports fast)
BOOTSTRAP_SEED = 0  #: seed of the bootstrap generator, so a re-rendered report shows the same intervals
GAMMA = 0.75  #: Bouthillier et al. 2021's "meaningful" threshold on P(A > B)
#: Fewest paired seeds for any verdict other than "no claim". Five: a clean 5/5 sweep is the
#: smallest paired sample whose one-sided sign test reaches p < 0.05 (0.5^5 = 0.031); below it
#: the percentile bootstrap of P(A > B) collapses to [1, 1] after a lucky 2/2 or 3/3.
MIN_PAIRS_FOR_CLAIM = 5

#: Fewest values per sample for a bootstrap CI: with 2 values the percentile bootstrap only
#: restates their range, which reads like an interval but is not one.
MIN_N_FOR_CI = 3

VERDICTS = ("better", "worse", "equivalent", "no claim")


def _clean(x: Sequence[float], keep_inf: bool = False) -> np.ndarray:
    a = np.asarray(x, dtype=float).ravel()
    return a[~np.isnan(a)] if keep_inf else a[np.isfinite(a)]


def iqm(x: Sequence[float]) -> float:
    """Interquartile mean of the finite values of ``x`` (``trim_mean(x, 0.25)``); nan if empty.

    With fewer than 4 values nothing is trimmed (it is the mean), as in scipy and rliable.
    """
    a = _clean(x)
    return float(_st.trim_mean(a, 0.25)) if a.size else float("nan")


def _iqm_axis(*samples, axis=-1):
    return _st.trim_mean(np.concatenate(samples, axis=-1), 0.25, axis=-1)


def bootstrap_ci(samples: Sequence[Sequence[float]], statistic: Callable, paired: bool = False,
                 confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES,
                 seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """Percentile-bootstrap CI of ``statistic(*samples, axis=-1)`` (vectorised over axis -1).

    Args:
        samples: one or more 1-D samples. Unpaired samples are resampled independently
            (stratified bootstrap); ``paired=True`` resamples the same indices in each
            (samples must then have equal length).
        statistic: ``f(*arrays, axis=-1) -> array``, as ``scipy.stats.bootstrap`` expects.
        confidence: two-sided level in (0, 1).

    Returns:
        (low, high); (nan, nan) when any sample has fewer than :data:`MIN_N_FOR_CI` values.
    """
    arrs = [np.asarray(s, dtype=float).ravel() for s in samples]
    if not arrs or any(a.size < MIN_N_FOR_CI for a in arrs):
        return float("nan"), float("nan")
    res = _st.bootstrap(tuple(arrs), statistic, paired=paired, vectorized=True, method="percentile",
                        confidence_level=confidence, n_resamples=n_resamples,
                        random_state=np.random.default_rng(seed))
    lo, hi = res.confidence_interval
    return float(lo), float(hi)


def iqm_ci(strata: Sequence[Sequence[float]] | Sequence[float], **kw) -> tuple[float, float, float]:
    """IQM and its stratified-bootstrap CI.

    Args:
        strata: either one sample (a flat sequence of per-seed values) or a list of samples,
            one per stratum (task / sweep point); the IQM is taken over the pooled values.
            Non-finite values are dropped first.

    Returns:
        (iqm, low, high). The CI is (nan, nan) when a stratum has fewer than
        :data:`MIN_N_FOR_CI` finite values.
    """
    groups = _as_strata(strata)
    groups = [_clean(g) for g in groups]
    groups = [g for g in groups if g.size]
    if not groups:
        return float("nan"), float("nan"), float("nan")
    point = iqm(np.concatenate(groups))
    lo, hi = bootstrap_ci(groups, _iqm_axis, **kw)
    return point, lo, hi


def _as_strata(x) -> list:
    if isinstance(x, np.ndarray):
        return [x] if x.ndim <= 1 else list(x)
    x = list(x)
    if x and all(np.ndim(g) == 1 for g in x):
        return x
    return [x]


def _pi_stat(a, b, axis=-1):
    return np.mean((a > b) + 0.5 * (a == b), axis=axis)


def orient(values: Sequence[float], higher_is_better: bool) -> np.ndarray:
    """Scores where larger is better (negated when lower is better); nan -> -inf (worst)."""
    a = np.asarray(values, dtype=float).ravel()
    a = a if higher_is_better else -a
    return np.where(np.isnan(a), -np.inf, a)


def prob_improvement(a: Sequence[float], b: Sequence[float], higher_is_better: bool = True) -> float:
    """P(A > B) from paired runs: mean over pairs i of 1[a_i better than b_i] + 1/2 1[tie].

    ``a[i]`` and ``b[i]`` must come from the same seed (Bouthillier et al. 2021, §4.1).
    A nan (diverged run) counts as the worst possible score; two nans tie.

    Raises:
        ValueError: ``a`` and ``b`` differ in length.
    """
    a, b = orient(a, higher_is_better), orient(b, higher_is_better)
    if a.shape != b.shape:
        raise ValueError(f"paired samples must have the same length, got {a.size} and {b.size}")
    return float(_pi_stat(a, b)) if a.size else float("nan")


def prob_improvement_ci(a: Sequence[float], b: Sequence[float], higher_is_better: bool = True,
                        **kw) -> tuple[float, float, float]:
    """P(A > B) and its paired percentile-bootstrap CI (resampling seed pairs).

    Returns:
        (p, low, high); the CI is (nan, nan) with fewer than :data:`MIN_N_FOR_CI` pairs.
    """
    p = prob_improvement(a, b, higher_is_better)
    oa, ob = orient(a, higher_is_better), orient(b, higher_is_better)
    if oa.size < MIN_N_FOR_CI:
        return p, float("nan"), float("nan")
    # scipy rejects inf in some versions' checks; map -inf to a finite sentinel below every score.
    finite = np.concatenate([oa[np.isfinite(oa)], ob[np.isfinite(ob)]])
    floor = (finite.min() - 1.0 - abs(finite.min())) if finite.size else -1.0
    oa, ob = np.where(np.isfinite(oa), oa, floor), np.where(np.isfinite(ob), ob, floor)
    lo, hi = bootstrap_ci([oa, ob], _pi_stat, paired=True, **kw)
    return p, lo, hi


def verdict(low: float, high: float, n_pairs: int, gamma: float = GAMMA,
            min_pairs: int = MIN_PAIRS_FOR_CLAIM) -> str:
    """The decision rule on the CI [low, high] of P(A > B) (Bouthillier et al. 2021, gamma = 0.75).

    * ``better``: low > 0.5 (significant) and high > gamma (meaningful);
    * ``worse``: the mirror image, high < 0.5 and low < 1 - gamma;
    * ``equivalent``: 1 - gamma <= low and high <= gamma (the CI excludes a meaningful
      difference either way);
    * ``no claim``: anything else, a missing CI, or fewer than ``min_pairs`` paired seeds
      (never a claim from one seed).
    """
    if n_pairs < min_pairs or not (math.isfinite(low) and math.isfinite(high)):
        return "no claim"
    if low > 0.5 and high > gamma:
        return "better"
    if high < 0.5 and low < 1 - gamma:
        return "worse"
    if low >= 1 - gamma and high <= gamma:
        return "equivalent"
    return "no claim"


RULE_TEXT = (
    f"Verdict rule (Bouthillier et al. 2021, §4.1, gamma = {GAMMA}): P(A > B) is the fraction of paired "
    f"seeds (same data order and initial weights) in which the variant beats the baseline on the comparison "
    f"metric (ties count 1/2; a diverged run counts as the worst score), with a {CONFIDENCE:.0%} "
    f"percentile-bootstrap CI over the pairs. **better**: CI low > 0.5 and CI high > {GAMMA}; **worse**: "
    f"CI high < 0.5 and CI low < {1 - GAMMA:.2f}; **equivalent**: CI inside [{1 - GAMMA:.2f}, {GAMMA}]; "
    f"otherwise **no claim**. Fewer than {MIN_PAIRS_FOR_CLAIM} paired seeds: always **no claim** "
    f"(never a claim from one seed). The intervals are not corrected for multiple comparisons: with k "
    f"variants against one baseline, expect about k x 2.5 % spurious 'better' CIs when nothing differs "
    f"(29 paired seeds per arm give the 0.75 threshold 95 % power, Bouthillier et al.).")


def wilson_interval(k: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Wilson score interval for a proportion k/n (``scipy.stats.binomtest(...).proportion_ci``).

    Returns (nan, nan) when n == 0. Raises ValueError when k is not in [0, n].
    """
    k, n = int(k), int(n)
    if n == 0:
        return float("nan"), float("nan")
    if not 0 <= k <= n:
        raise ValueError(f"count k={k} must lie in [0, n={n}]")
    ci = _st.binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def quantile_inf(x: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile where +inf means "never reached" (e.g. unsolved runs).

    nan values are dropped; interpolating towards an inf neighbour gives inf.
    """
    a = np.sort(_clean(x, keep_inf=True))
    if not a.size:
        return float("nan")
    pos = q * (a.size - 1)
    lo, hi = int(math.floor(pos)), int(math.ceil(pos))
    if lo == hi or pos == lo:
        return float(a[lo])
    if math.isinf(a[hi]) or math.isinf(a[lo]):
        return float(a[hi]) if math.isinf(a[hi]) else float(a[lo])
    return float(a[lo] + (a[hi] - a[lo]) * (pos - lo))


def median_iqr(x: Sequence[float]) -> tuple[float, float, float]:
    """(median, 25th percentile, 75th percentile), inf-aware (see :func:`quantile_inf`)."""
    return quantile_inf(x, 0.5), quantile_inf(x, 0.25), quantile_inf(x, 0.75)


def mean_std(x: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof = 1) of the finite values; std nan for n < 2."""
    a = _clean(x)
    if not a.size:
        return float("nan"), float("nan")
    return float(a.mean()), float(a.std(ddof=1)) if a.size > 1 else float("nan")


def _slope_axis(*strata, xs=None, axis=-1):
    # strata: arrays (..., n_i) of log y per x level; xs: log x per stratum
    ys = np.concatenate(strata, axis=-1)
    xv = np.concatenate([np.full(s.shape[-1], x) for s, x in zip(strata, xs)])
    xc = xv - xv.mean()
    return ((ys - ys.mean(axis=-1, keepdims=True)) * xc).sum(axis=-1) / (xc ** 2).sum()


def loglog_slope_ci(x_levels: Sequence[float], groups: Sequence[Sequence[float]], **kw) -> tuple[float, float, float]:
    """Least-squares slope of log y on log x and its stratified-bootstrap CI.

    Args:
        x_levels: the x value of each group (e.g. depths N), all > 0.
        groups: per x level, the y values over seeds (all > 0), e.g. gradient norms.

    Returns:
        (slope, low, high); seeds are resampled within each x level.

    Raises:
        ValueError: fewer than two x levels, or a non-positive value.
    """
    if len(x_levels) < 2 or len(x_levels) != len(groups):
        raise ValueError("need one group of y values per x level and at least two x levels")
    logs = []
    for g in groups:
        a = _clean(g)
        if (a <= 0).any():
            raise ValueError("log-log slope needs positive values")
        logs.append(np.log(a))
    lx = [math.log(v) for v in x_levels]
    slope = float(_slope_axis(*logs, xs=lx))

    def stat(*s, axis=-1):
        return _slope_axis(*s, xs=lx)

    lo, hi = bootstrap_ci(logs, stat, **kw)
    return slope, lo, hi


def rate_difference_ci(fail_a: Sequence[Sequence[bool]], fail_b: Sequence[Sequence[bool]],
                       confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """Difference of failure rates rate(A) - rate(B), pooled over strata, with Newcombe's
    hybrid score interval (Newcombe 1998, method 10: built from the two Wilson intervals).

    Unlike a bootstrap, the interval does not collapse when every stratum is all-or-none
    (e.g. 5/5 failures against 0/5). Pooling is fair here because both arms have the same
    seeds at every sweep point (a paired design).

    Args:
        fail_a, fail_b: per stratum (sweep point), the per-seed failure indicators of A and B.

    Returns:
        (difference, low, high); nan when an arm has no runs.
    """
    a = np.concatenate([np.asarray(g, dtype=float).ravel() for g in fail_a]) if len(fail_a) else np.array([])
    b = np.concatenate([np.asarray(g, dtype=float).ravel() for g in fail_b]) if len(fail_b) else np.array([])
    if not a.size or not b.size:
        return float("nan"), float("nan"), float("nan")
    p1, p2 = a.mean(), b.mean()
    l1, u1 = wilson_interval(int(a.sum()), a.size, confidence)
    l2, u2 = wilson_interval(int(b.sum()), b.size, confidence)
    d = p1 - p2
    return (float(d), float(d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)),
            float(d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)))


@dataclass(frozen=True)
class Comparison:
    """P(A > B) with its CI, the number of pairs and the verdict."""

    p: float
    low: float
    high: float
    n_pairs: int
    verdict: str


def compare_paired(a: Sequence[float], b: Sequence[float], higher_is_better: bool, **kw) -> Comparison:
    """P(A > B), its CI and the verdict for paired samples (see :func:`verdict`)."""
    p, lo, hi = prob_improvement_ci(a, b, higher_is_better, **kw)
    n = len(np.asarray(a).ravel())
    return Comparison(p, lo, hi, n, verdict(lo, hi, n))


def fmt_ci(point: float, low: float, high: float, digits: int = 3) -> str:
    """``"0.123 [0.100, 0.150]"``; the point alone when the CI is missing; "—" when nan."""
    if point is None or (isinstance(point, float) and math.isnan(point)):
        return "—"
    if math.isnan(low) or math.isnan(high):
        return f"{point:.{digits}f}"
    return f"{point:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def fmt_int_or_inf(v: float) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return "∞" if math.isinf(v) else f"{v:.0f}"
