"""The report's "Paired seeds on every metric" section (harness/report/paired.py): every metric's paired
counts beside the verdict's, descriptive, never for a variant check put in the baseline's class."""
from harness.report import write_report

from .test_report_compare import make_run

#: flip: lower held-out CE than the baseline at every seed (better) but lower exact-match (worse);
#: twin: the baseline's numbers, recorded by check in its class.
ARMS = {"baseline": (0.50, 0.80, ()), "flip": (0.40, 0.70, ()), "twin": (0.50, 0.80, ())}


def _section(text: str) -> str:
    return text.split("## Paired seeds on every metric", 1)[1].split("\n## ", 1)[0]


def test_every_metric_is_counted_in_its_direction_beside_the_verdicts_one(tmp_path):
    store = make_run(tmp_path, "a", ARMS, jitter=0.0, check=[["baseline", "twin"], ["flip"]])
    text = write_report(store).read_text()
    section = _section(text)
    header = next(ln for ln in section.splitlines() if ln.startswith("| variant"))
    assert "heldout_ce (verdict)" in header and "exact_match" in header and "time_to_solve_s" not in header
    row = dict(zip([c.strip() for c in header.strip("|").split("|")],
                   [c.strip() for c in next(ln for ln in section.splitlines() if ln.startswith("| flip")).strip("|")
                    .split("|")]))
    assert row["heldout_ce (verdict)"] == "6-0, p 0.031"  # lower is better: 6 wins
    assert row["exact_match"] == "0-6, p 0.031"  # higher is better: 6 losses
    assert row["early_loss"] == "0-0-6, p 1.000"  # equal at every seed: ties, no test
    assert "| twin" not in section  # the same function: rounding, no counts
    k = len(header.strip("|").split("|")) - 1
    assert f"with {k} metrics" in section and f"p < {0.05 / k:.3f}" in section and "not as a claim" in section
    assert text.index("## Results") < text.index("## Paired seeds") < text.index("## Plots")


def test_no_section_from_one_seed_or_without_a_baseline_to_pair_with(tmp_path):
    one = make_run(tmp_path, "one", ARMS, seeds=1, jitter=0.0)
    assert "## Paired seeds" not in write_report(one).read_text()
    alone = make_run(tmp_path, "alone", {"baseline": ARMS["baseline"]}, jitter=0.0)
    assert "## Paired seeds" not in write_report(alone).read_text()


def test_an_invalid_variant_keeps_its_counts_and_says_it_gets_no_verdict(tmp_path):
    from harness.trial import TrialResult, trial_key

    store = make_run(tmp_path, "inv", ARMS, jitter=0.0, check=[["baseline", "twin"], ["flip"]])
    for t in store.load_trials():
        if t.row["variant"] == "flip":
            row = dict(t.row, status="invalid", reason="at initialisation: decoder position 0 changed (train mode)")
            store.write_trial(trial_key("flip", row["seed"]), TrialResult(row, t.curve))
    section = _section(write_report(store).read_text())
    assert "| flip (invalid: no verdict) | " in section and "6-0, p 0.031" in section
    assert "an invalid variant's counts are descriptive only" in section
    clean = _section(write_report(make_run(tmp_path, "ok", ARMS, jitter=0.0)).read_text())
    assert "invalid" not in clean
