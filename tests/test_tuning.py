"""Learning-rate sweeps in the report (harness/report/tuning.py): the choice reads dev only, diverged
trials count as the worst, ties go to the smaller learning rate, the tuned verdict pairs each variant at
its own learning rate with the baseline at its own, and the sensitivity follows Wortsman et al. §2.2."""
import copy
import math

import numpy as np
import pytest

from harness.report import trials_frame, write_report
from harness.report.tuning import choose_lrs, sensitivity, swept_lrs, tuned_frame
from harness.runmeta import RunMeta
from harness.store import RunStore
from harness.trial import TrialResult, trial_key

from .test_report_compare import CFG

LRS = {"lr=0.001": 1e-3, "lr=0.003": 3e-3, "lr=0.01": 1e-2}


def _cfg(lr):
    cfg = copy.deepcopy(CFG)
    cfg["train"] = {k: v for k, v in cfg["train"].items() if k != "lr"} | {"lr": lr, "schedule": "cosine"}
    return cfg


def sweep_run(root, arms, seeds=6, run_id="sweep", default=3e-3):
    """A fabricated ``--lr-grid`` run: ``arms[variant][point] = (dev_ce, test_ce)`` or "diverged".
    Every seed gets the same per-seed shift on dev and test (paired seeds move together)."""
    meta = {"command": "fabricated", "preset": "tiny", "config": _cfg(default), "variants": sorted(arms),
            "seeds": list(range(seeds)), "environment": {"torch": "x"},
            "points": {p: _cfg(lr) for p, lr in LRS.items()}, "lr_grid": {"default": default, "values": list(LRS.values())}}
    store = RunStore.create(root, meta, run_id)
    shift = np.linspace(-0.01, 0.01, seeds)
    for variant, by_point in arms.items():
        for point, value in by_point.items():
            for s in range(seeds):
                div = value == "diverged"
                dev, test = (float("nan"), float("nan")) if div else (value[0] + shift[s], value[1] + shift[s])
                row = {"variant": variant, "seed": s, "point": point, "params": 1000, "steps": 100, "train_s": 0.5,
                       "early_loss": 2.4, "heldout_ce": test, "dev_ce": dev, "exact_match": 0.5,
                       "status": "diverged" if div else "ok", "reason": "non-finite loss" if div else "",
                       "wall_s": 0.6, "lr": LRS[point]}
                store.write_trial(trial_key(variant, s, point), TrialResult(row, []))
    return store


ARMS = {
    # best on dev at 3e-3; at the config's own 3e-3 too
    "baseline": {"lr=0.001": (0.30, 0.30), "lr=0.003": (0.20, 0.20), "lr=0.01": (0.40, 0.40)},
    # worse than the baseline at 3e-3, better than the baseline's best at its own 1e-2; diverges at none
    "late": {"lr=0.001": (0.50, 0.50), "lr=0.003": (0.35, 0.35), "lr=0.01": (0.15, 0.15)},
    # best dev at 1e-3 and 3e-3 alike (tie -> the smaller); diverges at 1e-2
    "fragile": {"lr=0.001": (0.25, 0.25), "lr=0.003": (0.25, 0.25), "lr=0.01": "diverged"},
}


def test_a_sweep_over_train_lr_alone_is_recognised_and_any_other_is_not():
    meta = RunMeta.from_dict({"config": _cfg(1e-3), "points": {p: _cfg(lr) for p, lr in LRS.items()}})
    assert swept_lrs(meta) == LRS
    two_keys = {p: dict(_cfg(lr), model=dict(CFG["model"], d_model=16 * (i + 1))) for i, (p, lr) in enumerate(LRS.items())}
    assert swept_lrs(RunMeta.from_dict({"config": _cfg(1e-3), "points": two_keys})) is None
    assert swept_lrs(RunMeta.from_dict({"config": _cfg(1e-3)})) is None


def test_the_choice_is_the_best_dev_median_diverged_worst_ties_to_the_smaller_lr(tmp_path):
    df = trials_frame(sweep_run(tmp_path, ARMS))
    chosen = choose_lrs(df, LRS, "dev_ce", higher_is_better=False)
    assert {v: c["lr"] for v, c in chosen.items()} == {"baseline": 3e-3, "late": 1e-2, "fragile": 1e-3}
    assert chosen["fragile"]["medians"]["lr=0.01"] == math.inf  # diverged: the worst value, never chosen


def test_the_choice_never_reads_the_test_split(tmp_path):
    store = sweep_run(tmp_path, ARMS)
    df = trials_frame(store)
    before = choose_lrs(df, LRS, "dev_ce", False)
    poisoned = df.assign(heldout_ce=np.where(df["point"] == "lr=0.001", -100.0, 100.0))  # test says 1e-3 wins
    assert choose_lrs(poisoned, LRS, "dev_ce", False) == before


def test_the_tuned_verdict_pairs_each_variant_at_its_own_lr(tmp_path):
    store = sweep_run(tmp_path, ARMS)
    text = write_report(store).read_text()
    section = text.split("## Learning-rate tuning", 1)[1].split("\n## ", 1)[0]
    row = {ln.split("|")[1].strip(): [c.strip() for c in ln.strip("|").split("|")] for ln in section.splitlines()
           if ln.startswith("| ") and not ln.startswith("| variant")}
    header = [c.strip() for c in next(ln for ln in section.splitlines() if ln.startswith("| variant")).strip("|").split("|")]
    late = dict(zip(header, row["late"]))
    assert late["chosen lr"] == "0.01 (edge)" and dict(zip(header, row["baseline"]))["chosen lr"] == "0.003"
    assert late["verdict at lr 0.003"].startswith("worse (sign test 0-6")  # 0.35 vs 0.20 at the config's lr
    assert late["tuned verdict (test)"].startswith("better (sign test 6-0")  # 0.15 at 1e-2 vs 0.20 at 3e-3
    assert (tmp_path / "sweep" / "lr_sensitivity.png").stat().st_size > 10_000
    assert "Wortsman et al. 2023" in section


def test_tuned_frame_keeps_each_variants_chosen_point_only(tmp_path):
    df = trials_frame(sweep_run(tmp_path, ARMS))
    chosen = choose_lrs(df, LRS, "dev_ce", False)
    t = tuned_frame(df, chosen)
    assert set(t["point"]) == {"tuned"} and len(t) == 3 * 6
    assert set(zip(t["variant"], t["lr"])) == {("baseline", 3e-3), ("late", 1e-2), ("fragile", 1e-3)}


def test_sensitivity_is_the_mean_gap_to_the_best_with_diverged_capped_at_ln_v(tmp_path):
    df = trials_frame(sweep_run(tmp_path, ARMS))
    # baseline medians 0.30, 0.20, 0.40: mean 0.30 - best 0.20
    assert sensitivity(df, LRS, "baseline", vocab=11) == pytest.approx(0.10)
    # fragile: 0.25, 0.25 and a diverged point at ln 11
    assert sensitivity(df, LRS, "fragile", vocab=11) == pytest.approx((0.25 + 0.25 + math.log(11)) / 3 - 0.25)


def test_a_run_without_a_sweep_has_no_tuning_section(tmp_path):
    from .test_report_compare import make_run

    store = make_run(tmp_path, "plain", {"baseline": (0.5, 0.9, ()), "pre_norm": (0.4, 0.9, ())})
    assert "## Learning-rate tuning" not in write_report(store).read_text()


def test_claims_on_a_sweep_read_sensitivity_per_seed_and_the_tuned_verdict(tmp_path):
    from harness.experiments.claims import evaluate_claim
    from harness.report import aggregate

    store = sweep_run(tmp_path, ARMS)
    df, meta = trials_frame(store), store.meta()
    rows = aggregate(df, "baseline", "heldout_ce", meta)
    status, evidence = evaluate_claim({"check": "sensitivity_lower", "a": "baseline", "b": "fragile"}, None, df, rows,
                                      "baseline", "heldout_ce", meta)
    assert status == "reproduced" and "6 of 6 pairs" in evidence
    status, _ = evaluate_claim({"check": "sensitivity_lower", "a": "fragile", "b": "baseline"}, None, df, rows,
                               "baseline", "heldout_ce", meta)
    assert status == "not reproduced"
    status, evidence = evaluate_claim({"check": "tuned_verdict", "variant": "late", "expected": "better"}, None, df,
                                      rows, "baseline", "heldout_ce", meta)
    assert status == "reproduced" and "late 0.01, baseline 0.003" in evidence
    status, _ = evaluate_claim({"check": "verdict", "variant": "late", "expected": "better", "point": "lr=0.003"}, None,
                               df, rows, "baseline", "heldout_ce", meta)
    assert status == "not reproduced"  # at one shared learning rate the verdict is the opposite


def test_a_sweeps_points_train_as_one_group_each_member_at_its_own_rate(tmp_path):
    """``--lr-grid`` with vectorised seeds: a variant's L x K members are one group (``vectorised`` = L x K),
    each at its own learning rate: the same numbers as its ordinary trial (tests/test_group.py's tolerance)."""
    import harness
    from harness.store import RunStore

    from .test_group import CE_RTOL, EARLY_RTOL

    runs = {mode: harness.run(variants=["baseline"], seeds=2, preset="tiny", device="cpu", jobs=1, threads=1,
                              vectorise_seeds=mode, results_dir=tmp_path, run_id=mode, check=False,
                              overrides={"train.schedule": "cosine"}, lr_grid=[1e-3, 1e-2])
            for mode in ("on", "off")}
    on, off = ({(t.row["point"], t.row["seed"]): t for t in RunStore.open(runs[m]).load_trials()} for m in ("on", "off"))
    assert on.keys() == off.keys() == {(p, s) for p in ("lr=0.001", "lr=0.01") for s in (0, 1)}
    for key, v in on.items():
        assert v.row["vectorised"] == 4 and v.row["lr"] == off[key].row["lr"] == float(key[0][3:])
        assert math.isclose(v.row["heldout_ce"], off[key].row["heldout_ce"], rel_tol=CE_RTOL), key
        for a, b in zip(v.curve, off[key].curve):
            tol = EARLY_RTOL if a["split"] == "train" and a["step"] <= 10 else CE_RTOL
            assert math.isclose(a["loss"], b["loss"], rel_tol=tol), (key, a, b)
    # the rate matters: the same seed's training losses part at the first steps
    assert on[("lr=0.001", 0)].curve[4]["loss"] != pytest.approx(on[("lr=0.01", 0)].curve[4]["loss"], rel=1e-3)


def test_lr_grid_with_the_noam_schedule_is_one_line_exit_2(tmp_path):
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "harness", "run", "--variants", "baseline", "--preset", "tiny",
                        "--lr-grid", "1e-3,3e-3", "--results-dir", str(tmp_path)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "train.schedule=cosine" in p.stderr
    assert not any(tmp_path.iterdir())  # refused before a run folder is made


def test_a_suite_of_sweeps_reports_tuned_verdicts_and_skips_a_task_interrupted_before_its_first_trial(tmp_path):
    """The GPU run of suite ``tuned`` was ended during its last task, whose trials.csv then held nothing:
    the suite report must still be written from the tasks that ran, each with its tuned verdicts."""
    from harness.suite.run import write_suite_report
    from harness.suite.spec import SuiteSpec

    store = sweep_run(tmp_path, ARMS, run_id="copy")
    write_report(store)  # writes trials.csv
    (tmp_path / "sort").mkdir()
    (tmp_path / "sort" / "trials.csv").write_text("\n")
    spec = SuiteSpec(name="t", preset="tiny", tasks=["copy", "sort"], variants=list(ARMS), seeds=6,
                     reference="baseline", lr_grid=list(LRS.values()))
    text = write_suite_report(tmp_path, spec, {"command": "x", "check": {"classes": []}}).read_text()
    table = text.split("## Tuned learning rates", 1)[1].split("\n## ", 1)[0]
    late = [c.strip() for c in next(ln for ln in table.splitlines() if ln.startswith("| late")).strip("|").split("|")]
    assert late == ["late", "0.01 (edge)"]  # its chosen learning rate on copy, the grid's largest; sort ran nothing
    row = next(ln for ln in text.split("## Verdicts", 1)[1].splitlines() if ln.startswith("| late"))
    assert "better" in row and "6-0" in row  # the tuned verdict, not the verdict at one shared learning rate
