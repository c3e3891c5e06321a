"""harness.stats: IQM, bootstrap intervals, P(A > B), the verdict rule, Wilson intervals."""
import math

import numpy as np
import pytest
from scipy import stats as st

from harness import stats


def test_iqm_is_the_25pct_trimmed_mean_and_ignores_an_outlier():
    x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 1000.0]
    assert stats.iqm(x) == pytest.approx(st.trim_mean(x, 0.25))
    assert stats.iqm(x) == pytest.approx(4.5)  # middle four: 3, 4, 5, 6
    assert stats.iqm([1.0, np.nan, 3.0, np.inf]) == pytest.approx(2.0)  # non-finite dropped
    assert math.isnan(stats.iqm([]))


def test_iqm_ci_brackets_the_estimate_and_needs_three_values():
    rng = np.random.default_rng(0)
    x = rng.normal(10.0, 1.0, 20)
    point, lo, hi = stats.iqm_ci(x)
    assert lo < point < hi
    assert 8.5 < lo and hi < 11.5
    p2, lo2, hi2 = stats.iqm_ci([1.0, 2.0])
    assert p2 == pytest.approx(1.5) and math.isnan(lo2) and math.isnan(hi2)


def test_bootstrap_is_reproducible():
    x = np.random.default_rng(1).normal(size=15)
    assert stats.iqm_ci(x) == stats.iqm_ci(x)


def test_stratified_ci_resamples_within_strata():
    # two strata with very different levels: pooled IQM stays between them and the CI is
    # narrower than when the strata are merged into one sample (between-strata variance removed)
    rng = np.random.default_rng(2)
    a, b = rng.normal(0.0, 0.1, 10), rng.normal(5.0, 0.1, 10)
    _, lo_s, hi_s = stats.iqm_ci([a, b])
    _, lo_m, hi_m = stats.iqm_ci(np.concatenate([a, b]))
    assert 0 < lo_s < hi_s < 5
    assert hi_s - lo_s < hi_m - lo_m


def test_prob_improvement_counts_paired_wins_with_half_ties():
    a = [1.0, 2.0, 3.0, 4.0]
    b = [0.0, 2.0, 5.0, 1.0]  # win, tie, loss, win
    assert stats.prob_improvement(a, b, higher_is_better=True) == pytest.approx(2.5 / 4)
    assert stats.prob_improvement(a, b, higher_is_better=False) == pytest.approx(1.5 / 4)


def test_prob_improvement_treats_nan_as_the_worst_score():
    # lower is better (cross-entropy); a diverged run (nan) loses to any finite value, two nans tie
    assert stats.prob_improvement([np.nan, np.nan], [5.0, np.nan], higher_is_better=False) == pytest.approx(0.25)


def test_prob_improvement_rejects_unpaired_lengths():
    with pytest.raises(ValueError, match="same length"):
        stats.prob_improvement([1.0, 2.0], [1.0], True)


@pytest.mark.parametrize("low,high,n,expected", [
    (0.6, 0.9, 10, "better"),
    (0.5, 0.9, 10, "no claim"),       # CI touches 0.5: not significant
    (0.55, 0.7, 10, "equivalent"),    # significant but not meaningful: inside [0.25, 0.75]
    (0.4, 0.8, 10, "no claim"),       # neither significant nor inside the equivalence band
    (0.1, 0.4, 10, "worse"),
    (0.3, 0.7, 30, "equivalent"),
    (0.2, 0.7, 30, "no claim"),       # too wide for equivalence
    (1.0, 1.0, 1, "no claim"),        # one seed: never a claim
    (1.0, 1.0, 4, "no claim"),        # below MIN_PAIRS_FOR_CLAIM
    (1.0, 1.0, 5, "better"),
    (float("nan"), float("nan"), 10, "no claim"),
])
def test_verdict_rule(low, high, n, expected):
    assert stats.verdict(low, high, n) == expected


def test_compare_paired_detects_clear_differences_and_equivalence():
    rng = np.random.default_rng(3)
    base = rng.normal(1.0, 0.1, 10)
    better = base - 0.5  # lower cross-entropy on every seed
    assert stats.compare_paired(better, base, higher_is_better=False).verdict == "better"
    assert stats.compare_paired(base, better, higher_is_better=False).verdict == "worse"
    # same distribution, independent noise, 40 pairs: the CI of P(A > B) sits inside [0.25, 0.75]
    x, y = rng.normal(0, 1, 40), rng.normal(0, 1, 40)
    c = stats.compare_paired(x, y, higher_is_better=True)
    assert c.n_pairs == 40
    assert c.verdict in ("equivalent", "no claim")
    assert c.low < 0.5 + 0.25 and c.high > 0.5 - 0.25


def test_compare_paired_with_one_seed_makes_no_claim():
    c = stats.compare_paired([0.1], [0.9], higher_is_better=False)
    assert c.p == 1.0 and c.verdict == "no claim"


def test_wilson_interval_matches_the_closed_form():
    z = st.norm.ppf(0.975)
    for k, n in [(0, 10), (3, 10), (5, 5), (17, 40)]:
        p = k / n
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
        lo, hi = stats.wilson_interval(k, n)
        assert lo == pytest.approx(max(0.0, centre - half), abs=1e-9)
        assert hi == pytest.approx(min(1.0, centre + half), abs=1e-9)
    assert all(math.isnan(v) for v in stats.wilson_interval(0, 0))
    with pytest.raises(ValueError):
        stats.wilson_interval(6, 5)


def test_median_iqr_with_unsolved_runs_as_infinity():
    med, q1, q3 = stats.median_iqr([100, 200, 300, np.inf, np.inf])
    assert (med, q1, q3) == (300, 200, math.inf)
    med, q1, q3 = stats.median_iqr([100, 200, 300, 400])
    assert med == pytest.approx(250) and q1 == pytest.approx(175) and q3 == pytest.approx(325)


def test_loglog_slope_recovers_a_power_law():
    rng = np.random.default_rng(4)
    Ns = [2, 4, 6, 8, 12]
    groups = [3.0 * n ** -0.5 * np.exp(rng.normal(0, 0.05, 10)) for n in Ns]
    s, lo, hi = stats.loglog_slope_ci(Ns, groups)
    assert s == pytest.approx(-0.5, abs=0.05)
    assert lo < -0.5 < hi
    flat = [np.exp(rng.normal(0, 0.05, 10)) for _ in Ns]
    s0, lo0, hi0 = stats.loglog_slope_ci(Ns, flat)
    assert lo0 < 0 < hi0
    with pytest.raises(ValueError):
        stats.loglog_slope_ci([2], [[1.0, 2.0]])


def test_rate_difference_ci_is_newcombe_and_does_not_collapse():
    a = [[1, 1, 1, 0, 1], [1, 1, 1, 1, 1]]
    b = [[0, 0, 0, 0, 1], [0, 0, 0, 0, 0]]
    d, lo, hi = stats.rate_difference_ci(a, b)
    assert d == pytest.approx(0.9 - 0.1)
    assert 0 < lo < d < hi < 1
    # Newcombe (1998) method 10 from the two Wilson intervals
    l1, u1 = stats.wilson_interval(9, 10)
    l2, u2 = stats.wilson_interval(1, 10)
    assert lo == pytest.approx(d - math.sqrt((0.9 - l1) ** 2 + (u2 - 0.1) ** 2))
    assert hi == pytest.approx(d + math.sqrt((u1 - 0.9) ** 2 + (0.1 - l2) ** 2))
    # all-or-none strata (5/5 vs 0/5) still give an interval of non-zero width
    d, lo, hi = stats.rate_difference_ci([[1] * 5], [[0] * 5])
    assert d == 1.0 and 0 < lo < 1.0 and hi == pytest.approx(1.0)


def test_formatting_helpers():
    assert stats.fmt_ci(0.5, 0.25, 0.75, 2) == "0.50 [0.25, 0.75]"
    assert stats.fmt_ci(0.5, float("nan"), float("nan"), 2) == "0.50"
    assert stats.fmt_ci(float("nan"), 0, 1) == "—"
    assert stats.fmt_int_or_inf(math.inf) == "∞"
