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
  scores better than B, ties counting 1/2; 95 % Wilson score interval over the pairs
  (:func:`wilson_score_interval`), which does not collapse to [1, 1] after a clean sweep as a
  percentile bootstrap over 5 pairs does.
* **Verdict** (:func:`verdict`, stated in :data:`RULE_TEXT`): ``better`` / ``worse`` rest on the
  exact two-sided sign test on the paired wins and losses (ties dropped; ``scipy.stats.binomtest``),
  p < :data:`ALPHA`, together with an upper (lower) bound of the P(A > B) interval beyond gamma =
  0.75 (a meaningful effect is possible); they need :data:`MIN_PAIRS_SIGN_TEST` = 6 untied pairs.
  ``equivalent``: the P(A > B) interval inside [0.25, 0.75], which needs
  :data:`MIN_PAIRS_EQUIVALENT` = 12 pairs. Otherwise ``no claim``, with the reason.
* **Wilson interval** for a count x/n (diverged runs, failure rates): ``scipy.stats.binomtest``;
  a difference of two rates gets Newcombe's hybrid score interval built from two Wilson intervals.

All functions take plain sequences (lists, numpy arrays, pandas Series) and return floats;
an interval that cannot be computed (too few values) is ``(nan, nan)``. Bootstrap results
are reproducible: the generator is seeded with :data:`BOOTSTRAP_SEED`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
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
ALPHA = 0.05  #: two-sided level of the sign test behind "better" / "worse"


def _z(confidence: float) -> float:
    """Two-sided standard-normal quantile, e.g. 1.95996 for 0.95 (stdlib: no scipy import)."""
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def wilson_score_interval(successes: float, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Wilson score interval (Wilson 1927) for a proportion ``successes / n``, closed form.

    Unlike :func:`wilson_interval` (scipy, integer counts) ``successes`` may be fractional: P(A > B)
    counts a tie as 1/2. Treating each pair's score (0, 1/2 or 1) as a Bernoulli outcome
    over-states its variance (a [0, 1]-valued score with mean p has variance <= p (1 - p)), so ties
    make the interval conservative, never narrower. It never has zero width for n >= 1.

    Returns:
        (low, high) clipped to [0, 1]; (nan, nan) when n == 0.

    Raises:
        ValueError: ``successes`` not in [0, n].
    """
    if n == 0:
        return float("nan"), float("nan")
    if not 0 <= successes <= n:
        raise ValueError(f"successes={successes} must lie in [0, n={n}]")
    z = _z(confidence)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def sign_test_p(wins: int, losses: int) -> float:
    """Exact two-sided sign test: ``scipy.stats.binomtest(wins, wins + losses, 0.5).pvalue``.

    Ties are dropped before the call (the conditional sign test). 1.0 when nothing is untied.
    """
    n = int(wins) + int(losses)
    return float(_st.binomtest(int(wins), n, 0.5).pvalue) if n else 1.0


def _fewest_pairs_for_sign_test(alpha: float = ALPHA) -> int:
    # A clean n-0 sweep has the smallest p-value n untied pairs can give: 2 * 0.5**n (exact).
    n = 1
    while 2 * 0.5 ** n >= alpha:
        n += 1
    return n


def _equivalent_interval(low: float, high: float, gamma: float = GAMMA) -> bool:
    return 1 - gamma <= low and high <= gamma


def _fewest_pairs_for_equivalence(gamma: float = GAMMA, confidence: float = CONFIDENCE) -> int:
    # P = 1/2 (all pairs tied, or as many wins as losses) gives the narrowest Wilson interval at a
    # given n: half-width z / (2 sqrt(n + z^2)), <= gamma - 1/2 from n >= z^2 (1 / (4 (gamma - 1/2)^2) - 1).
    n = 1
    while not _equivalent_interval(*wilson_score_interval(n / 2, n, confidence), gamma):
        n += 1
    return n


#: Fewest untied pairs for "better" or "worse": a clean 6-0 sweep has two-sided sign-test
#: p = 2 x 0.5^6 = 0.031 < 0.05, while 5-0 has p = 0.0625 (computed by :func:`_fewest_pairs_for_sign_test`).
MIN_PAIRS_SIGN_TEST = _fewest_pairs_for_sign_test()
#: Fewest pairs for "equivalent": with every pair tied, the 95 % Wilson interval of P(A > B) is
#: [0.254, 0.746] at 12 pairs and [0.246, 0.754] at 11 (computed by :func:`_fewest_pairs_for_equivalence`).
MIN_PAIRS_EQUIVALENT = _fewest_pairs_for_equivalence()

#: Fewest values per sample for a bootstrap CI: with 2 values the percentile bootstrap only
#: restates their range, which reads like an interval but is not one.
MIN_N_FOR_CI = 3


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


def orient(values: Sequence[float], higher_is_better: bool) -> np.ndarray:
    """Scores where larger is better (negated when lower is better); nan -> -inf (worst)."""
    a = np.asarray(values, dtype=float).ravel()
    a = a if higher_is_better else -a
    return np.where(np.isnan(a), -np.inf, a)


def paired_outcomes(a: Sequence[float], b: Sequence[float], higher_is_better: bool = True) -> tuple[int, int, int]:
    """(wins, losses, ties) of A against B over paired runs.

    ``a[i]`` and ``b[i]`` must come from the same seed (Bouthillier et al. 2021, §4.1).
    A nan (diverged run) counts as the worst possible score; two nans tie.

    Raises:
        ValueError: ``a`` and ``b`` differ in length.
    """
    a, b = orient(a, higher_is_better), orient(b, higher_is_better)
    if a.shape != b.shape:
        raise ValueError(f"paired samples must have the same length, got {a.size} and {b.size}")
    return int((a > b).sum()), int((a < b).sum()), int((a == b).sum())


def prob_improvement(a: Sequence[float], b: Sequence[float], higher_is_better: bool = True) -> float:
    """P(A > B) from paired runs: mean over pairs i of 1[a_i better than b_i] + 1/2 1[tie].

    See :func:`paired_outcomes` for pairing and nan. nan when there is no pair.

    Raises:
        ValueError: ``a`` and ``b`` differ in length.
    """
    w, l, t = paired_outcomes(a, b, higher_is_better)
    n = w + l + t
    return (w + t / 2) / n if n else float("nan")


def verdict(wins: int, losses: int, ties: int, gamma: float = GAMMA, alpha: float = ALPHA,
            confidence: float = CONFIDENCE) -> tuple[str, str]:
    """The decision rule on paired outcomes, and the test and numbers behind it.

    With n = wins + losses + ties pairs, P(A > B) = (wins + ties / 2) / n and [low, high] its
    Wilson score interval (:func:`wilson_score_interval`):

    * ``better``: exact two-sided sign test on wins vs losses (ties dropped) p < ``alpha``, more
      wins than losses, and high > ``gamma`` (a meaningful effect is possible; Bouthillier et
      al. 2021). Needs :data:`MIN_PAIRS_SIGN_TEST` untied pairs (6-0 gives p = 0.031).
    * ``worse``: the mirror image (more losses, low < 1 - gamma).
    * ``equivalent``: 1 - gamma <= low and high <= gamma: the interval excludes a meaningful
      difference either way, even where the sign test finds a small significant one (the reason
      then says so). Needs :data:`MIN_PAIRS_EQUIVALENT` pairs.
    * ``no claim``: anything else.

    A percentile-bootstrap interval is never used: after 5/5 wins it is [1, 1], after all ties
    [0.5, 0.5], whatever the number of pairs.

    Returns:
        (verdict, reason): one of "better", "worse", "equivalent", "no claim" and e.g. ``"sign test 6-0, p = 0.031"`` or
        ``"all 5 pairs tied; equivalence needs >= 12 pairs"``.
    """
    w, l, t = int(wins), int(losses), int(ties)
    n = w + l + t
    if n == 0:
        return "no claim", "no paired seeds"
    low, high = wilson_score_interval(w + t / 2, n, confidence)
    p_sign = sign_test_p(w, l)
    p_text = "p < 0.001" if p_sign < 0.001 else f"p = {p_sign:.3f}"
    sign = f"sign test {w}-{l}" + (f" ({t} tied)" if t else "") + f", {p_text}"
    ci = f"P(A > B) Wilson {confidence:.0%} CI [{low:.3f}, {high:.3f}]"
    if p_sign < alpha and w > l and high > gamma:
        return "better", sign
    if p_sign < alpha and l > w and low < 1 - gamma:
        return "worse", sign
    if _equivalent_interval(low, high, gamma):
        extra = f"; {sign}: a small difference, not a meaningful one" if p_sign < alpha else ""
        return "equivalent", f"{ci} inside [{1 - gamma:.2f}, {gamma:.2f}], {n} pairs{extra}"
    need_eq = f"; equivalence needs >= {MIN_PAIRS_EQUIVALENT} pairs" if n < MIN_PAIRS_EQUIVALENT else ""
    if t == n:
        return "no claim", f"all {n} pairs tied{need_eq}"
    if w + l < MIN_PAIRS_SIGN_TEST:
        return "no claim", f"{n} pair{'s' if n != 1 else ''}, {sign} (needs >= {MIN_PAIRS_SIGN_TEST} untied pairs without a loss)"
    if p_sign < alpha:
        return "no claim", f"{sign}, but {ci} neither reaches {gamma:.2f} nor lies inside [{1 - gamma:.2f}, {gamma:.2f}]"
    return "no claim", f"{sign} >= {alpha}; {ci} not inside [{1 - gamma:.2f}, {gamma:.2f}]"


RULE_TEXT = (
    f"Verdict rule: each paired seed (same data order and initial weights) is a win, loss or tie of the "
    f"variant against the baseline on the comparison metric (a diverged run is the worst score; two tie). "
    f"P(A > B) = (wins + ties/2) / pairs, with a {CONFIDENCE:.0%} Wilson score interval (ties count 1/2; "
    f"unlike a percentile bootstrap it does not collapse to [1, 1] after a clean sweep). **better**: the "
    f"exact two-sided sign test on wins vs losses (ties dropped, `scipy.stats.binomtest`) gives p < {ALPHA} "
    f"with more wins, and the interval's upper bound exceeds gamma = {GAMMA} (Bouthillier et al. 2021: a "
    f"meaningful effect is possible); this needs >= {MIN_PAIRS_SIGN_TEST} untied pairs (a clean "
    f"{MIN_PAIRS_SIGN_TEST}-0 sweep gives p = 2 x 0.5^{MIN_PAIRS_SIGN_TEST} = "
    f"{2 * 0.5 ** MIN_PAIRS_SIGN_TEST:.3f}; {MIN_PAIRS_SIGN_TEST - 1}-0 gives "
    f"{2 * 0.5 ** (MIN_PAIRS_SIGN_TEST - 1):.4f}). **worse**: the mirror image. **equivalent**: the interval "
    f"lies inside [{1 - GAMMA:.2f}, {GAMMA:.2f}] (a meaningful difference excluded either way); this needs "
    f">= {MIN_PAIRS_EQUIVALENT} pairs (all tied: [0.254, 0.746] at 12 pairs, [0.246, 0.754] at 11). "
    f"Otherwise **no claim**, with the reason; never a claim from one seed. No correction for multiple "
    f"comparisons: with k variants against one baseline expect up to k x 2.5 % spurious 'better' verdicts "
    f"when nothing differs.")


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
    """A paired comparison of A with B: P(A > B) with its Wilson interval, the outcome counts,
    the sign test and the verdict with its reason (see :func:`verdict`)."""

    p: float  #: P(A > B), ties counting 1/2
    low: float  #: Wilson score interval of P(A > B)
    high: float
    n_pairs: int
    verdict: str  #: "better", "worse", "equivalent" or "no claim"
    wins: int = 0
    losses: int = 0
    ties: int = 0
    sign_p: float = float("nan")  #: exact two-sided sign-test p-value (ties dropped)
    reason: str = ""  #: the test and numbers behind the verdict

    def label(self) -> str:
        """``"better (sign test 6-0, p = 0.031)"``; ``"no claim: all 5 pairs tied ..."``."""
        if not self.reason:
            return self.verdict
        return f"{self.verdict}: {self.reason}" if self.verdict == "no claim" else f"{self.verdict} ({self.reason})"


def compare_paired(a: Sequence[float], b: Sequence[float], higher_is_better: bool,
                   confidence: float = CONFIDENCE) -> Comparison:
    """P(A > B), its Wilson interval and the verdict for paired samples (see :func:`verdict`)."""
    w, l, t = paired_outcomes(a, b, higher_is_better)
    n = w + l + t
    low, high = wilson_score_interval(w + t / 2, n, confidence)
    v, reason = verdict(w, l, t, confidence=confidence)
    return Comparison((w + t / 2) / n if n else float("nan"), low, high, n, v, w, l, t, sign_test_p(w, l), reason)


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


def curve_mean(steps: Sequence[float], values: Sequence[float]) -> float:
    """Mean of a curve over the steps it spans: the trapezoidal area under ``values`` against
    ``steps`` divided by ``steps[-1] - steps[0]`` (the held-out loss curve's "AUC" per step, in the
    values' unit). nan with fewer than two points or a zero span. Lower for a loss: learned earlier.
    """
    x, y = np.asarray(steps, dtype=float), np.asarray(values, dtype=float)
    if x.size < 2 or x[-1] == x[0]:
        return float("nan")
    return float(((y[1:] + y[:-1]) / 2 * np.diff(x)).sum() / (x[-1] - x[0]))
