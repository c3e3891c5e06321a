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


@pytest.mark.parametrize("wins,losses,ties,expected", [
    (6, 0, 0, "better"),          # sign test p = 2 x 0.5^6 = 0.031
    (5, 0, 0, "no claim"),        # p = 0.0625: a clean 5/5 sweep is not enough
    (0, 6, 0, "worse"),
    (0, 5, 0, "no claim"),
    (8, 1, 0, "better"),          # p = 0.039
    (7, 1, 0, "no claim"),        # p = 0.070
    (4, 2, 0, "no claim"),
    (1, 0, 0, "no claim"),        # one seed: never a claim
    (0, 0, 1, "no claim"),
    (0, 0, 5, "no claim"),        # all tied, too few pairs for equivalence
    (0, 0, 11, "no claim"),       # Wilson [0.246, 0.754] pokes out of [0.25, 0.75]
    (0, 0, 12, "equivalent"),     # Wilson [0.254, 0.746]
    (15, 15, 0, "equivalent"),
    (6, 0, 30, "equivalent"),     # significant (p = 0.031) but P(A > B) cannot reach 0.75
    (10, 20, 0, "no claim"),      # p = 0.099, interval too wide for equivalence
    (0, 0, 0, "no claim"),
])
def test_verdict_rule(wins, losses, ties, expected):
    assert stats.verdict(wins, losses, ties)[0] == expected


def test_equivalent_says_when_the_sign_test_finds_a_small_difference():
    v, reason = stats.verdict(6, 0, 30)  # the example in docs/statistics.md
    assert v == "equivalent"
    assert reason == ("P(A > B) Wilson 95% CI [0.422, 0.729] inside [0.25, 0.75], 36 pairs; "
                      "sign test 6-0 (30 tied), p = 0.031: a small difference, not a meaningful one")


def test_five_clean_wins_are_no_claim_by_the_sign_test():
    # Before: the percentile bootstrap of P(A > B) over 5 pairs was [1, 1] and gave "better".
    c = stats.compare_paired([0.1, 0.2, 0.3, 0.4, 0.5], [1.0, 1.1, 1.2, 1.3, 1.4], higher_is_better=False)
    assert (c.wins, c.losses, c.ties, c.n_pairs) == (5, 0, 0, 5)
    assert c.verdict == "no claim"
    assert c.sign_p == pytest.approx(st.binomtest(5, 5, 0.5).pvalue) == pytest.approx(0.0625)
    assert c.label() == "no claim: 5 pairs, sign test 5-0, p = 0.062 (needs >= 6 untied pairs without a loss)"
    # the reported interval is not degenerate: Wilson [0.566, 1]
    assert c.p == 1.0 and c.low == pytest.approx(0.5655, abs=1e-4) and c.high == 1.0


def test_six_clean_wins_are_better_with_the_sign_test_in_the_text():
    c = stats.compare_paired(np.arange(6.0), np.arange(6.0) + 1, higher_is_better=False)
    assert c.verdict == "better"
    assert c.sign_p == pytest.approx(st.binomtest(6, 6, 0.5).pvalue) == pytest.approx(0.03125)
    assert c.label() == "better (sign test 6-0, p = 0.031)"
    assert stats.compare_paired(np.arange(6.0) + 1, np.arange(6.0), higher_is_better=False).label() == \
        "worse (sign test 0-6, p = 0.031)"
    assert stats.verdict(3, 27, 0) == ("worse", "sign test 3-27, p < 0.001")


def test_all_ties_need_the_minimum_pairs_for_equivalence():
    # Before: all ties gave the percentile-bootstrap interval [0.5, 0.5] and "equivalent" at any n.
    five = stats.compare_paired([0.7] * 5, [0.7] * 5, higher_is_better=False)
    assert five.verdict == "no claim"
    assert five.label() == "no claim: all 5 pairs tied; equivalence needs >= 12 pairs"
    n = stats.MIN_PAIRS_EQUIVALENT
    eq = stats.compare_paired([0.7] * n, [0.7] * n, higher_is_better=False)
    assert eq.verdict == "equivalent" and eq.p == 0.5
    assert eq.label() == "equivalent (P(A > B) Wilson 95% CI [0.254, 0.746] inside [0.25, 0.75], 12 pairs)"
    assert stats.compare_paired([0.7] * (n - 1), [0.7] * (n - 1), False).verdict == "no claim"


def test_minimum_pair_counts_are_what_the_rule_needs():
    """MIN_PAIRS_SIGN_TEST and MIN_PAIRS_EQUIVALENT (stated in RULE_TEXT and docs/statistics.md)."""
    assert stats.MIN_PAIRS_SIGN_TEST == 6 and stats.MIN_PAIRS_EQUIVALENT == 12
    # a clean n-0 sweep is the most extreme outcome of n untied pairs
    assert all(st.binomtest(n, n, 0.5).pvalue >= 0.05 for n in range(1, 6))
    assert st.binomtest(6, 6, 0.5).pvalue < 0.05
    # all tied at n pairs: the Wilson interval around 1/2 fits inside [0.25, 0.75] from n = 12;
    # at even n it matches scipy's Wilson interval for n/2 successes
    lo12, hi12 = st.binomtest(6, 12).proportion_ci(method="wilson")
    assert stats.wilson_score_interval(6, 12) == (pytest.approx(lo12), pytest.approx(hi12))
    assert 0.25 <= lo12 and hi12 <= 0.75
    lo10, hi10 = st.binomtest(5, 10).proportion_ci(method="wilson")
    assert lo10 < 0.25
    lo11, hi11 = stats.wilson_score_interval(5.5, 11)
    assert lo11 < 0.25 < 0.75 < hi11
    z = st.norm.ppf(0.975)
    assert math.ceil(3 * z * z) == 12
    # away from 1/2 it takes more pairs: wins (no ties) that give "equivalent" at 20 and 30 pairs
    assert [w for w in range(21) if stats.verdict(w, 20 - w, 0)[0] == "equivalent"] == [9, 10, 11]
    assert [w for w in range(31) if stats.verdict(w, 30 - w, 0)[0] == "equivalent"] == [13, 14, 15, 16, 17]
    # one loss needs 9 untied pairs (8-1), two losses 12 (10-2)
    assert stats.verdict(8, 1, 0)[0] == "better" and stats.verdict(7, 1, 0)[0] == "no claim"
    assert stats.verdict(10, 2, 0)[0] == "better" and stats.verdict(9, 2, 0)[0] == "no claim"
    assert round(st.binomtest(10, 12).pvalue, 3) == 0.039 and round(st.binomtest(8, 9).pvalue, 3) == 0.039  # closed form: n >= z^2 (1 / (4 (gamma - 1/2)^2) - 1)
    assert "needs >= 6 untied pairs" in stats.RULE_TEXT and "needs >= 12 pairs" in stats.RULE_TEXT


def test_sign_test_power_quoted_in_the_docs():
    """docs/statistics.md: with no ties and P(A > B) = 0.75, "better" first reaches 80 % power at 30
    pairs and 95 % at 49 (exact binomial sums over the sign test's rejection region)."""
    def power(n):
        return sum(st.binom.pmf(w, n, 0.75) for w in range(n + 1)
                   if w > n - w and stats.verdict(w, n - w, 0)[0] == "better")
    first = {t: next(n for n in range(6, 80) if power(n) >= t) for t in (0.8, 0.95)}
    assert first == {0.8: 30, 0.95: 49}


def test_wilson_score_interval_accepts_half_counts_and_never_collapses():
    for k, n in [(0, 5), (2, 5), (5, 5), (17, 40)]:
        ci = st.binomtest(k, n).proportion_ci(method="wilson")
        assert stats.wilson_score_interval(k, n) == (pytest.approx(ci.low, abs=1e-12), pytest.approx(ci.high, abs=1e-12))
    for x, n in [(0, 1), (2.5, 5), (5, 5), (0, 5)]:
        lo, hi = stats.wilson_score_interval(x, n)
        assert hi - lo > 0.3
    assert all(math.isnan(v) for v in stats.wilson_score_interval(0, 0))
    with pytest.raises(ValueError):
        stats.wilson_score_interval(5.5, 5)


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
