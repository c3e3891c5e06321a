"""Reports from stored trials, ``report`` and ``compare`` (a regression test) on fabricated and real runs."""
import numpy as np
import pytest

from harness import cli, stats
from harness.report import aggregate, summary_table, terminal_table, to_markdown, trials_frame, write_report
from harness.trial import TrialResult, TrialSpec
from harness.store import RunStore
from harness.trial import trial_key

CFG = {"model": {"N": 1, "d_model": 16, "h": 2, "d_ff": 32, "dropout": 0.0, "vocab": 11, "pad": 0, "max_len": 16},
       "train": {"task": "copy", "seq_len": 6, "batch": 16, "steps": 100, "lr": 1.0, "warmup": 10, "schedule": "noam",
                 "label_smoothing": 0.1, "eval_every": 50, "eval_sequences": 64, "eval_seed": 1234, "grad_clip": 0.0,
                 "stop_at_solved": False}}


def make_run(root, run_id, arms, seeds=6, rng_seed=0, jitter=0.005, spread=0.02, failed=None, jitter_seed=None,
             check=None):
    """A fabricated run: ``arms`` maps variant -> (mean held-out CE, exact-match, diverged seeds).

    ``spread``: std of the per-seed effect shared by every variant (and by another run made with
    the same ``rng_seed``); ``jitter``: std of each trial's own noise (drawn from ``jitter_seed``,
    default ``rng_seed``: a run made again with the same seeds is bit-identical); ``failed``: variant -> seeds
    whose trial raised (stored as the executor stores a crashed trial: status ``failed``, no metrics);
    ``check``: check's equivalence classes as ``run`` records them in config.json (key ``check``).
    """
    rng = np.random.default_rng(rng_seed)
    trial_rng = np.random.default_rng([rng_seed if jitter_seed is None else jitter_seed, 1])
    meta = {"command": "fabricated", "preset": "tiny", "config": CFG, "variants": sorted(arms),
            "seeds": list(range(seeds)), "environment": {"torch": "x"}}
    if check is not None:
        meta["check"] = {"classes": check, "failures": [], "scope": "pairs", "wall_s": 0.1}
    store = RunStore.create(root, meta, run_id)
    noise = rng.normal(0, spread, seeds)  # shared per seed: paired seeds move together
    for variant, (ce, em, diverged) in arms.items():
        for s in range(seeds):
            if s in (failed or {}).get(variant, ()):
                row = {"variant": variant, "seed": s, "point": "", "status": "failed",
                       "reason": "RuntimeError: CUDA out of memory", "wall_s": float("nan")}
                store.write_trial(trial_key(variant, s), TrialResult(row))
                continue
            div = s in diverged
            row = {"variant": variant, "slot_norm": "pre" if "pre" in variant else "post",
                   "slot_embedding": "separate", "slot_attention": "annotated", "slot_mask": "bool",
                   "seed": s, "point": "", "params": 1000 + len(variant), "steps": 100, "train_s": 0.5,
                   "early_loss": 2.4 + noise[s], "final_train_loss": ce + 0.3,
                   "heldout_ce": float("nan") if div else ce + noise[s] + trial_rng.normal(0, jitter),
                   "heldout_token_acc": 0.9, "exact_match": 0.0 if div else min(1.0, em + noise[s]),
                   "steps_to_solve": float("nan") if div or em < 0.99 else 50 + 10 * s, "time_to_solve_s": 1.0,
                   "tokens_per_s": 1000.0, "status": "diverged" if div else "ok",
                   "reason": "non-finite loss at step 3" if div else "", "wall_s": 0.6}
            curve = [{"step": t, "split": "train", "loss": 2.5 / t ** 0.3} for t in range(1, 101)]
            curve += [{"step": t, "split": "heldout", "loss": ce * 100 / t, "exact_match": min(1, em * t / 100),
                       "wall_s": t / 200} for t in (50, 100)]
            store.write_trial(trial_key(variant, s), TrialResult(row, curve))
    return store


def test_report_has_every_column_a_verdict_and_the_plots(tmp_path):
    store = make_run(tmp_path, "a", {"baseline": (0.5, 0.99, ()), "pre_norm": (0.3, 1.0, ()),
                                     "shared_embeddings": (0.5, 0.99, (2,))})
    path = write_report(store)
    text = path.read_text()
    for col in ("params", "step ms", "early loss (mean ± std)", "held-out CE IQM [95% CI]",
                "exact-match IQM [95% CI]", "steps to EM≥0.99 median [IQR]", "diverged x/n [Wilson 95%]",
                "P(> baseline) [95% CI]", "verdict", "Verdict rule:", "exact two-sided sign test",
                "needs >= 6 untied pairs", "needs >= 12 pairs"):
        assert col in text, col
    for png in ("curves.png", "final_metrics.png", "steps_to_solve.png"):
        assert (store.root / png).stat().st_size > 5000
        assert f"]({png})" in text
    table = summary_table(trials_frame(store))
    assert list(table["variant"]) == ["baseline", "pre_norm", "shared_embeddings"]  # baseline first
    verdicts = dict(zip(table["variant"], table["verdict"]))
    assert verdicts["pre_norm"] == "**better** (sign test 6-0, p = 0.031)"  # lower CE on all 6 paired seeds
    assert not verdicts["shared_embeddings"].startswith("**better**")
    p_col = dict(zip(table["variant"], table["P(> baseline) [95% CI]"]))
    assert p_col["pre_norm"] == "1.00 [0.61, 1.00] n=6"  # Wilson interval, not the bootstrap's [1.00, 1.00]
    div = dict(zip(table["variant"], table["diverged x/n [Wilson 95%]"]))
    assert div["shared_embeddings"].startswith("1/6 [")
    assert div["baseline"].startswith("0/6 [")


def test_diverged_run_counts_as_worst_in_the_comparison(tmp_path):
    store = make_run(tmp_path, "a", {"baseline": (0.5, 0.99, ()), "bad": (0.5, 0.99, (0, 1, 2, 3, 4, 5))})
    rows = aggregate(trials_frame(store), "baseline")
    bad = next(r for r in rows if r.variant == "bad")
    assert bad.comparison.p == 0.0 and bad.comparison.verdict == "worse" and bad.verdict == "worse"
    assert (bad.diverged.k, bad.diverged.n) == (6, 6) and not bad.same_function
    assert bad.diverged.high > bad.diverged.low and bad.solved == 0  # a Wilson interval; no diverged seed solved


def test_five_seeds_verdicts_state_their_test(tmp_path):
    """5/5 wins and 5 ties: before, bootstrap intervals [1, 1] -> "better" and [0.5, 0.5] -> "equivalent"."""
    store = make_run(tmp_path, "a", {"baseline": (0.5, 0.99, ()), "pre_norm": (0.3, 1.0, ()),
                                     "additive_mask": (0.5, 0.99, ())}, seeds=5, jitter=0.0)
    table = summary_table(trials_frame(store))
    verdicts = dict(zip(table["variant"], table["verdict"]))
    assert verdicts["pre_norm"] == "no claim: 5 pairs, sign test 5-0, p = 0.062 (needs >= 6 untied pairs without a loss)"
    assert verdicts["additive_mask"] == "no claim: all 5 pairs tied; equivalence needs >= 12 pairs"
    p_col = dict(zip(table["variant"], table["P(> baseline) [95% CI]"]))
    assert p_col["pre_norm"] == "1.00 [0.57, 1.00] n=5" and p_col["additive_mask"] == "0.50 [0.17, 0.83] n=5"


def test_one_seed_never_makes_a_claim(tmp_path):
    store = make_run(tmp_path, "a", {"baseline": (0.9, 0.5, ()), "pre_norm": (0.1, 1.0, ())}, seeds=1)
    table = summary_table(trials_frame(store))
    assert list(table["verdict"]) == ["—", "no claim: 1 pair, sign test 1-0, p = 1.000 (needs >= 6 untied pairs "
                                           "without a loss)"]
    assert "never a claim from one seed" in write_report(store).read_text()
    # one seed: no interval anywhere in the row, no P(> baseline) figure
    assert list(table["P(> baseline) [95% CI]"]) == ["(baseline)", "1 seed: no interval"]
    assert list(table["diverged x/n [Wilson 95%]"]) == ["0/1", "0/1"]
    shown = terminal_table(table)
    assert "1.00 [" not in shown and "1 seed: no interval" in shown and "[95% CI]" not in shown


def test_terminal_table_fits_120_columns_and_keeps_the_verdict(tmp_path):
    """The main job's shape (11 variants, one seed) and an 8-seed run with long verdicts: at most
    120 characters a line; report.md keeps the wide table."""
    names = ["baseline", "additive_mask", "d2l_attention", "pre_norm", "shared_embeddings", "torch_attention",
             "seed_000", "seed_001", "seed_002", "seed_003", "seed_004"]
    for seeds in (1, 8):
        store = make_run(tmp_path, f"w{seeds}", {n: (0.5 - 0.01 * i, 0.99, ()) for i, n in enumerate(names)},
                         seeds=seeds)
        table = summary_table(trials_frame(store))
        shown = terminal_table(table)
        assert max(map(len, shown.splitlines())) <= 120, shown
        assert all(n in shown for n in names) and "verdict" in shown and "held-out CE" in shown
        assert "report.md" in shown.splitlines()[-1]
        wide = to_markdown(table)
        assert max(map(len, wide.splitlines())) > 120
        if seeds == 1:  # report.md keeps the wide table (plots are slow: once)
            assert wide in write_report(store).read_text()
    assert "**better**" in shown and "[95% CI]" in shown  # 8 seeds: the intervals stay


def test_terminal_table_of_a_sweep_keeps_the_point_that_tells_the_rows_apart(tmp_path):
    """A sweep's table has two rows per variant; without ``point`` they cannot be told apart (an
    experiment over d_model printed two unlabelled "baseline" rows). The reasons go before it."""
    import pandas as pd

    store = make_run(tmp_path, "sweep", {"baseline": (0.5, 0.99, ()), "unscaled_embeddings": (0.4, 1.0, ())}, seeds=8)
    one = summary_table(trials_frame(store))
    rows = []
    for point in ("d_model=64", "d_model=256"):
        rows.append(one.assign(point=point, verdict=["—", "**better** (sign test 15-1, p < 0.001)"]))
    table = pd.concat(rows, ignore_index=True)
    table = table[["variant", "point", *[c for c in table.columns if c not in ("variant", "point")]]]
    shown = terminal_table(table)
    lines = shown.splitlines()
    assert max(map(len, lines)) <= 120, shown
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[:2] == ["variant", "point"]
    cells = [[c.strip() for c in line.strip("|").split("|")][:2] for line in lines[2:6]]
    assert cells == [["baseline", "d_model=64"], ["unscaled_embeddings", "d_model=64"],
                     ["baseline", "d_model=256"], ["unscaled_embeddings", "d_model=256"]]


def test_wrapped_table_fits_the_width_without_losing_or_breaking_a_name():
    """A 300-character summary beside identifiers: every line <= 120, the identifiers (<= 24
    characters) whole, every word of every cell still there in order, the long column the widest."""
    import re

    import pandas as pd

    from harness.report.terminal import wrapped_table

    words = [f"word{i}" for i in range(50)]
    df = pd.DataFrame({"name": ["xiong_grad_norm_at_init", "a"], "slots": ["norm=pre, layer_norm=rmsnorm", "-"],
                       "summary": [" ".join(words), "short"], "source": ["Xiong et al. 2020 §3 " * 3, "x"]})
    text = wrapped_table(df)
    lines = text.splitlines()
    assert max(map(len, lines)) <= 120
    cols = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    assert "xiong_grad_norm_at_init" in [c[0] for c in cols]
    assert re.findall(r"word\d+", " ".join(c[2] for c in cols)) == words
    widths = [len(cell) for cell in lines[0].strip("|").split("|")]
    assert widths[2] == max(widths)
    assert wrapped_table(df.head(0)) == "_no rows_"
    narrow = pd.DataFrame({"a": ["x" * 10], "b": ["y" * 10]})
    assert wrapped_table(narrow) == narrow.to_markdown(index=False, tablefmt="github")  # fits: as it is
    # five columns whose longest words (24 characters each) cannot all stay whole in 120: broken, not over
    long = pd.DataFrame({f"c{i}": [f"{'w' * 24} short words here"] for i in range(5)})
    text = wrapped_table(long)
    assert max(map(len, text.splitlines())) <= 120, text
    assert text.count("w") == 5 * (24 + 1)  # every letter still there ("words" has one), across lines


def test_compare_text_lists_each_distinct_note_once_under_the_table():
    import pandas as pd

    from harness.report.terminal import compare_text

    few = "1 seed(s) finished in both runs; the paired CI needs >= 3"
    table = pd.DataFrame({"variant": ["a", "a", "b"], "metric": ["heldout_ce", "exact_match", "heldout_ce"],
                          "status": ["too few seeds"] * 2 + ["no change"], "note": [few, few, ""]})
    text = compare_text(table)
    rows, notes = text.split("\n\n")
    assert notes.splitlines() == [f"[1] {few}"]
    assert [line.split("|")[-2].strip() for line in rows.splitlines()[2:]] == ["[1]", "[1]", ""]


def test_retry_failed_is_suggested_only_where_a_retry_can_help(capsys, tmp_path):
    from harness.commands.run import print_failures

    invalid = {"variant": "leaky", "seed": 0, "status": "invalid", "reason": "future leak"}
    crashed = {"variant": "flaky", "seed": 1, "status": "failed", "reason": "RuntimeError: CUDA out of memory"}
    print_failures([invalid], 2, tmp_path)
    err = capsys.readouterr().err
    assert "INVALID" in err and "leaky" in err and "--retry-failed" not in err
    print_failures([invalid, crashed], 3, tmp_path)
    err = capsys.readouterr().err
    assert f"python -m harness run --resume {tmp_path} --retry-failed" in err


def test_partial_run_report_opens_with_a_banner_until_it_is_complete(tmp_path):
    from harness.report import partial_banner

    store = make_run(tmp_path, "p", {"baseline": (0.5, 0.99, ()), "pre_norm": (0.4, 1.0, ())}, seeds=2)
    meta = store.meta()
    meta.trials = [TrialSpec(v, s, {}) for v in ("baseline", "pre_norm", "seed_004")
                   for s in range(2)]
    meta.status = "interrupted"
    store.write_meta(meta)
    lines = write_report(store).read_text().splitlines()
    assert lines[2].startswith("> **Partial run: 4 of 6 planned trials done** (interrupted)")
    assert f"python -m harness run --resume {store.root}" in lines[2]
    assert partial_banner(store, markdown=False)[0].startswith("PARTIAL RUN: 4 of 6 planned trials done")
    meta.trials = meta.trials[:4]
    meta.status = "complete"  # what a resume to completion leaves
    store.write_meta(meta)
    assert partial_banner(store) == [] and partial_banner(store, markdown=False) == []  # report.md: test_resume


def test_report_command_rerenders_from_stored_data(tmp_path, capsys):
    store = make_run(tmp_path, "a", {"baseline": (0.5, 0.99, ()), "pre_norm": (0.4, 1.0, ())})
    assert not (store.root / "report.md").exists()
    assert cli.main(["report", str(store.root)]) == 0
    assert (store.root / "report.md").is_file()
    assert "pre_norm" in capsys.readouterr().out
    assert cli.main(["report", "a", "--results-dir", str(tmp_path), "--baseline", "pre_norm", "-q"]) == 0
    assert "P(> pre_norm)" in (store.root / "report.md").read_text()
    assert cli.main(["report", str(tmp_path / "missing")]) == 2
    assert cli.main(["report", str(store.root), "--baseline", "nope"]) == 2
    assert cli.main(["report", str(store.root), "--metric", "nope"]) == 2


def test_compare_gates_a_degraded_run(tmp_path, capsys):
    a = make_run(tmp_path, "a", {"baseline": (0.5, 0.99, ()), "pre_norm": (0.4, 1.0, ())}, rng_seed=1)
    # the same seeds again (same per-seed effects), each trial with its own small noise
    same = make_run(tmp_path, "same", {"baseline": (0.5, 0.99, ()), "pre_norm": (0.4, 1.0, ())}, rng_seed=1,
                    jitter_seed=2)
    worse = make_run(tmp_path, "worse", {"baseline": (0.5, 0.99, ()), "pre_norm": (0.9, 0.6, ())}, rng_seed=3)
    unstable = make_run(tmp_path, "unstable", {"baseline": (0.5, 0.99, (0, 1, 2, 3, 4, 5)), "pre_norm": (0.4, 1.0, ())},
                        rng_seed=4)
    assert cli.main(["compare", str(a.root), str(same.root)]) == 0
    assert "no regression" in capsys.readouterr().out
    assert cli.main(["compare", str(a.root), str(worse.root)]) == 1
    out = capsys.readouterr().out
    assert "REGRESSION" in out and "pre_norm heldout_ce" in out and "pre_norm exact_match" in out
    assert "baseline heldout_ce" not in out.split("REGRESSION", 1)[1]
    # improvement is not a regression; the reverse direction is
    assert cli.main(["compare", str(worse.root), str(a.root)]) == 0
    assert cli.main(["compare", str(a.root), str(unstable.root), "--metrics", "exact_match"]) == 1
    assert "baseline failed or diverged" in capsys.readouterr().out
    # a tolerance larger than the damage silences the gate
    assert cli.main(["compare", str(a.root), str(worse.root), "--metrics", "heldout_ce", "--tolerance", "1.0"]) == 0


ARMS = {"baseline": (0.5, 0.99, ()), "pre_norm": (0.4, 1.0, ())}


def _cell(a, b, variant: str, metric: str, column: str, **options) -> str:
    """One cell of ``harness.compare(a, b)``'s table: what the ``compare`` command shows in that row
    (wrapped on the terminal; this is the cell whole)."""
    import harness

    table = harness.compare(a.root, b.root, **options).table
    return table[(table["variant"] == variant) & (table["metric"] == metric)][column].item()


def test_the_python_api_compares_and_verifies_as_the_commands_do(tmp_path, capsys):
    """``harness.compare`` / ``harness.verify`` return what ``compare`` / ``verify`` print (one code
    path below ``commands/``): the same table, verdict and exit status; the same problem lines."""
    import harness
    from harness.report.terminal import compare_text

    a = make_run(tmp_path, "a", ARMS, rng_seed=1)
    worse = make_run(tmp_path, "worse", {"baseline": (0.5, 0.99, ()), "pre_norm": (0.9, 0.6, ())}, rng_seed=3)
    outcome = harness.compare("a", "worse", results_dir=tmp_path, metrics="heldout_ce,exact_match")
    assert not outcome.ok and outcome.exit_code == 1
    assert sorted(outcome.regressed["variant"] + " " + outcome.regressed["metric"]) == \
        ["pre_norm exact_match", "pre_norm heldout_ce"]
    assert cli.main(["compare", str(a.root), str(worse.root)]) == 1
    out = capsys.readouterr().out
    assert compare_text(outcome.table) in out and outcome.verdict() in out
    assert max(map(len, out.splitlines()[3:-2])) <= 120  # the table and its notes (not the folders' paths)
    assert harness.compare(a.root, a.root).ok
    with pytest.raises(harness.HarnessError, match="unknown metric 'bleu'"):
        harness.compare(a.root, worse.root, metrics=["bleu"])

    assert harness.verify(a.root).ok
    (worse.root / "trials.csv").write_text("variant\n")  # tables that no longer match the trial files
    checked = harness.verify("worse", results_dir=tmp_path)
    assert not checked.ok and checked.exit_code == 1
    assert checked.problems[0].startswith("trials.csv: does not match the trial files")
    assert cli.main(["verify", str(worse.root), "-q"]) == 1
    assert capsys.readouterr().out.splitlines() == [f"{worse.root}/{line}" for line in checked.problems]


def test_compare_candidate_whose_trials_all_failed_is_a_regression(tmp_path, capsys):
    """Before: 5/5 crashed trials left no values, every row said "too few seeds" and it exited 0."""
    a = make_run(tmp_path, "a", ARMS, seeds=5)
    b = make_run(tmp_path, "b", ARMS, seeds=5, failed={"pre_norm": range(5)})
    assert cli.main(["compare", str(a.root), str(b.root)]) == 1
    out = capsys.readouterr().out
    assert "pre_norm failed or diverged" in out and "all 5 trials of B failed" in out
    assert _cell(a, b, "pre_norm", "failed or diverged", "B") == "5/5 (5 failed, 0 diverged) [0.57, 1.00]"
    assert "baseline failed or diverged" not in out.split("REGRESSION", 1)[1]
    # every trial of every variant crashed: the run has no metric columns at all
    dead = make_run(tmp_path, "dead", ARMS, seeds=5, failed={"baseline": range(5), "pre_norm": range(5)})
    assert cli.main(["compare", str(a.root), str(dead.root)]) == 1
    # "always": even when the reference crashed at those seeds too
    assert cli.main(["compare", str(dead.root), str(dead.root)]) == 1


def test_compare_new_crash_at_one_seed_is_a_regression(tmp_path, capsys):
    a = make_run(tmp_path, "a", ARMS, seeds=5)
    b = make_run(tmp_path, "b", ARMS, seeds=5, failed={"pre_norm": (2,)})
    assert cli.main(["compare", str(a.root), str(b.root), "--metrics", "heldout_ce"]) == 1
    out = capsys.readouterr().out
    assert "B failed at seed(s) 2 where A did not (seed 2: RuntimeError: CUDA out of memory)" in out
    # the same crash in the reference is not new: 1/5 against 1/5 is no regression
    a2 = make_run(tmp_path, "a2", ARMS, seeds=5, failed={"pre_norm": (2,)})
    assert cli.main(["compare", str(a2.root), str(b.root), "--metrics", "heldout_ce"]) == 0


@pytest.mark.parametrize("n_diverged,code", [(4, 1), (3, 1), (2, 0), (1, 0)])
def test_compare_diverged_candidate_is_a_regression_by_newcombe(tmp_path, capsys, n_diverged, code):
    """Before: 4/5 diverged against 0/5 showed "no change" (the Wilson intervals overlap) and exited 0.
    Now the Newcombe interval of rate(B) - rate(A) decides: with 5 seeds a side, 3/5 or more is a
    regression, 2/5 or fewer is not (as docs/statistics.md states)."""
    a = make_run(tmp_path, "a", ARMS, seeds=5)
    b = make_run(tmp_path, "b", {**ARMS, "pre_norm": (0.4, 1.0, tuple(range(n_diverged)))}, seeds=5)
    assert cli.main(["compare", str(a.root), str(b.root), "--metrics", "heldout_ce"]) == code
    out = capsys.readouterr().out
    assert _cell(a, b, "pre_norm", "failed or diverged", "B").startswith(f"{n_diverged}/5 (0 failed, {n_diverged} diverged)")
    if code:
        assert "pre_norm failed or diverged" in out and "Newcombe 95% CI of rate(B) - rate(A) above 0" in out
    d, lo, hi = stats.rate_difference_ci([[1] * n_diverged + [0] * (5 - n_diverged)], [[0] * 5])
    assert (lo > 0) == bool(code)


def test_compare_bootstrap_is_paired_by_seed(tmp_path, capsys):
    """A large seed-to-seed spread shared by both runs and a small consistent shift: the paired
    bootstrap over seeds finds it; resampling each run on its own (the old unpaired CI) would not."""
    a = make_run(tmp_path, "a", {"baseline": (0.5, 0.99, ())}, seeds=8, rng_seed=7, spread=0.5, jitter=0.001)
    b = make_run(tmp_path, "b", {"baseline": (0.55, 0.99, ())}, seeds=8, rng_seed=7, spread=0.5, jitter=0.001)
    assert cli.main(["compare", str(a.root), str(b.root), "--metrics", "heldout_ce"]) == 1
    out = capsys.readouterr().out
    assert "baseline heldout_ce" in out and "paired bootstrap over 8 seeds" in out
    va = trials_frame(a).sort_values("seed")["heldout_ce"].to_numpy()
    vb = trials_frame(b).sort_values("seed")["heldout_ce"].to_numpy()
    lo, hi = stats.bootstrap_ci([va, vb], lambda x, y, axis=-1: stats._iqm_axis(y) - stats._iqm_axis(x))
    assert lo < 0 < hi  # unpaired: the shift drowns in the spread
    lo_p, hi_p = stats.bootstrap_ci([va, vb], lambda x, y, axis=-1: stats._iqm_axis(y - x), paired=True)
    assert 0.04 < lo_p < hi_p < 0.06


def test_paired_ci_of_three_pairs_is_their_range():
    """docs/statistics.md: with 3 pairs the paired percentile CI of the IQM (= mean) of B - A runs from the
    smallest to the largest difference, so it excludes 0 exactly when all three share a sign."""
    from harness.report.compare import _paired_diff_stat
    a = np.array([1.0, 5.0, 9.0])
    for d in ([0.01, 0.02, 0.05], [-0.01, 0.02, 0.05]):
        lo, hi = stats.bootstrap_ci([a, a + np.array(d)], _paired_diff_stat, paired=True)
        assert (lo, hi) == (pytest.approx(min(d)), pytest.approx(max(d)))


def test_newcombe_numbers_quoted_in_the_docs():
    # 3/5 against 0/5 is a regression, 2/5 is not (docs/statistics.md, compare)
    assert [round(v, 2) for v in stats.rate_difference_ci([[1, 1, 1, 0, 0]], [[0] * 5])[1:]] == [0.03, 0.88]
    assert [round(v, 2) for v in stats.rate_difference_ci([[1, 1, 0, 0, 0]], [[0] * 5])[1:]] == [-0.12, 0.77]


def test_compare_bad_input_exits_2(tmp_path, capsys):
    a = make_run(tmp_path, "a", {"baseline": (0.5, 0.99, ())})
    other = make_run(tmp_path, "other", {"pre_norm": (0.5, 0.99, ())})
    empty = RunStore.create(tmp_path, {"config": CFG}, "empty")
    assert cli.main(["compare", str(a.root), str(tmp_path / "nope")]) == 2
    assert cli.main(["compare", str(a.root), str(empty.root)]) == 2
    assert cli.main(["compare", str(a.root), str(other.root)]) == 2
    assert cli.main(["compare", str(a.root), str(a.root), "--metrics", "bogus"]) == 2
    err = capsys.readouterr().err
    assert err.count("harness: error:") == 4 and "Traceback" not in err


def test_compare_real_tiny_runs(tmp_path, capsys):
    """End to end: the same tiny run twice is not a regression; 2 steps instead of 20 is."""
    common = ["run", "--preset", "tiny", "--variants", "baseline", "--seeds", "3", "-q", "--device", "cpu",
              "--results-dir", str(tmp_path)]
    assert cli.main(common + ["--run-id", "ref"]) == 0
    assert cli.main(common + ["--run-id", "again"]) == 0
    assert cli.main(common + ["--run-id", "short", "--set", "train.steps=2"]) == 0
    capsys.readouterr()
    assert cli.main(["compare", "ref", "again", "--results-dir", str(tmp_path)]) == 0
    assert cli.main(["compare", "ref", "short", "--results-dir", str(tmp_path), "--metrics", "heldout_ce"]) == 1
    out = capsys.readouterr().out
    assert "train.steps: 20 -> 2" in out and "regressed" in out


def test_extra_sections_land_at_their_positions_and_report_imports_no_experiments(tmp_path):
    """A caller adds a section with one item: fixed lines or a renderer of the report's context."""
    import ast

    from harness import report
    from harness.report import Section

    store = make_run(tmp_path, "s", {"baseline": (0.5, 0.99, ()), "pre_norm": (0.3, 1.0, ())}, seeds=3)
    seen = {}

    def renderer(ctx):
        seen["baseline"], seen["metric"], seen["n"] = ctx.baseline, ctx.metric, len(ctx.df)
        return ["## After results", ""]

    text = write_report(store, sections=[Section("end", ["## The end", ""]), Section("after_results", renderer),
                                         Section("top", ["## Overview", ""])], title="Custom").read_text()
    assert text.startswith("# Custom: run `s`")
    heads = [line for line in text.splitlines() if line.startswith("## ")]
    assert heads.index("## Overview") < heads.index("## Environment")
    assert heads.index("## Results") < heads.index("## After results") < heads.index("## Plots")
    assert heads[-1] == "## The end"
    assert seen == {"baseline": "baseline", "metric": "heldout_ce", "n": 6}
    with pytest.raises(ValueError, match="unknown section position 'middle'"):
        Section("middle", [])
    for path in report.__path__:  # reporting depends on nothing above it
        from pathlib import Path

        for f in Path(path).glob("*.py"):
            mods = {n.module or "" for n in ast.walk(ast.parse(f.read_text())) if isinstance(n, ast.ImportFrom)}
            assert not any("experiments" in m or "commands" in m for m in mods), f


# ------------------------------------------------------------------------- same function (check)

TWIN_ARMS = {"baseline": (0.5, 0.99, ()), "twin": (0.499, 0.99, ()), "pre_norm": (0.499, 0.99, ())}


def test_a_variant_check_puts_in_the_baselines_class_is_same_function_never_a_verdict(tmp_path):
    """twin and pre_norm both "win" every seed by 0.001 nats (rounding-sized); check recorded twin in the
    baseline's class, so only pre_norm gets a verdict and a probability."""
    from harness.api import summary_frame

    store = make_run(tmp_path, "a", TWIN_ARMS, jitter=0.0, check=[["baseline", "twin"], ["pre_norm"]])
    df = trials_frame(store)
    rows = {r.variant: r for r in aggregate(df, "baseline", meta=store.meta())}
    twin, pre = rows["twin"], rows["pre_norm"]
    assert twin.comparison.wins == 6 and twin.comparison.p == 1.0  # the raw test: a clean sweep ...
    assert twin.same_function and twin.verdict == "same function"  # ... reported as the same function
    assert not pre.same_function and pre.verdict == "better" and not rows["baseline"].same_function
    table = summary_table(df, "baseline", meta=store.meta(), rows=list(rows.values())).set_index("variant")
    assert table.loc["twin", "P(> baseline) [95% CI]"] == "= (same function)"
    assert table.loc["twin", "verdict"].startswith("same function") and "1.00" not in table.loc["twin"].to_string()
    assert table.loc["pre_norm", "P(> baseline) [95% CI]"] == "1.00 [0.61, 1.00] n=6"
    assert table.loc["pre_norm", "verdict"] == "**better** (sign test 6-0, p = 0.031)"
    frame = summary_frame(list(rows.values())).set_index("variant")
    assert frame["same_function"].to_dict() == {"baseline": False, "pre_norm": False, "twin": True}
    assert frame.loc["twin", "verdict"] == "same function" and np.isnan(frame.loc["twin", "p_better"])
    assert frame.loc["pre_norm", "p_better"] == 1.0 and frame.loc["twin", "n_pairs"] == 6
    text = write_report(store).read_text()
    assert "**same function**: `check`" in text and "Here: twin." in text  # the legend says what it means
    assert "Hatched rows marked `= baseline (check)` (twin)" in text
    results = text.split("## Results", 1)[1].split("## Plots", 1)[0]
    assert not [ln for ln in results.splitlines() if ln.startswith("| twin ") and "1.00 [" in ln]


def test_same_function_needs_the_recorded_class_and_the_baseline(tmp_path):
    """Without recorded classes (``--no-check``) the same trials give twin an ordinary verdict; against
    another baseline, twin is not in that baseline's class."""
    plain = make_run(tmp_path, "plain", TWIN_ARMS, jitter=0.0)
    verdicts = dict(zip(*summary_table(trials_frame(plain)).loc[:, ["variant", "verdict"]].T.values))
    assert verdicts["twin"] == "**better** (sign test 6-0, p = 0.031)"
    store = make_run(tmp_path, "a", TWIN_ARMS, jitter=0.0, check=[["baseline", "twin"], ["pre_norm"]])
    rows = {r.variant: r for r in aggregate(trials_frame(store), "pre_norm", meta=store.meta())}
    assert not rows["twin"].same_function and rows["twin"].verdict == "no claim"  # all 6 tied with pre_norm
    rows = {r.variant: r for r in aggregate(trials_frame(store), "baseline", meta=store.meta(), classes=[])}
    assert not rows["twin"].same_function  # explicit classes (the suite's) replace the recorded ones


def test_final_metrics_axis_is_never_narrower_than_the_floor(tmp_path, monkeypatch):
    """CE values 0.499-0.5 (a 0.001 spread): matplotlib alone would stretch them across the axis."""
    from harness.report import plots

    assert plots.min_span_limits(0.499, 0.5) == pytest.approx((0.4495, 0.5495))  # 20 % of 0.5 = 0.1 wide
    assert plots.min_span_limits(0.001, 0.002) == (0.0, 0.01)  # the floor, kept non-negative
    assert plots.min_span_limits(0.1, 0.9) == (0.1, 0.9)  # wide enough already: unchanged
    store = make_run(tmp_path, "a", TWIN_ARMS, spread=0.0, jitter=0.0, check=[["baseline", "twin"], ["pre_norm"]])
    df = trials_frame(store)
    rows = aggregate(df, "baseline", meta=store.meta())
    plt, figs = plots.pyplot(), []
    monkeypatch.setattr(plt, "close", lambda fig=None: figs.append(fig))
    assert plots.plot_final_metrics(df, rows, tmp_path / "f.png") and plots.plot_steps_to_solve(
        df, rows, tmp_path / "s.png", 100)
    ce_axis, steps_axis = figs[0].axes[0], figs[1].axes[0]
    lo, hi = ce_axis.get_xlim()
    assert hi - lo >= plots.MIN_SPAN_FRACTION * 0.5 - 1e-12 and lo <= 0.499 and hi >= 0.5
    y_twin = len(rows) - 1 - [r.variant for r in rows].index("twin")  # rows are drawn top-down
    for ax in (ce_axis, figs[0].axes[1], steps_axis):  # twin is marked, the others are not
        marks = [t for t in ax.texts if t.get_text() == plots.SAME_FUNCTION_MARK]
        assert len(marks) == 1 and marks[0].xy[1] == pytest.approx(y_twin + 0.24)
    for fig in figs:
        fig.clf()


def test_a_zoomed_axis_says_so():
    from harness.report.plots import pyplot
    from harness.report.plots import note_zoom

    plt = pyplot()
    fig, (near, full) = plt.subplots(1, 2)
    near.set_xlim(0.30, 0.33)
    full.set_xlim(0.0, 0.33)
    assert note_zoom(near) and "ZOOMED: the axis starts at 0.3, not 0" in near.get_title()
    assert not note_zoom(full) and "ZOOMED" not in full.get_title()
    plt.close(fig)


def test_compare_lists_real_config_differences_not_keys_added_or_renamed_since():
    """A run stored before ``model.window`` / ``train.log_every`` existed, with ``train.lr`` (the old
    name of noam_factor), against today's config of the same settings: no differences; a value that
    differs, or an added key away from its default, is still listed."""
    from types import SimpleNamespace

    from harness.config import get_preset
    from harness.settings import ADDED
    from harness.report.compare import config_differences

    today = get_preset("quick").to_dict()
    old = {s: {k: v for k, v in t.items() if k not in ADDED.get(s, {})} for s, t in today.items()}
    old["train"]["lr"] = old["train"].pop("noam_factor")
    meta = SimpleNamespace
    assert config_differences(meta(config=old), meta(config=today)) == []
    changed = {s: dict(t) for s, t in today.items()}
    changed["model"]["window"], changed["model"]["d_model"] = 4, 32
    assert config_differences(meta(config=old), meta(config=changed)) == [
        "model.d_model: 64 -> 32", "model.window: 0 -> 4"]
