"""``run --suite``: suite files are validated; every task is an ordinary stored run; the report's
verdict table, negative control and findings come from the stored trials; a leaking plugin in a
suite is INVALID and never ranked; a finished suite resumes without training again."""
from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from harness import stats
from harness.suite import report as suite_report
from harness.errors import ConfigError
from harness.suite.spec import SuiteSpec, load_suite

from .conftest import ROOT, cli_in_process

TINY = """description = "tiny test suite"
preset = "tiny"
tasks = ["copy", "reverse"]
variants = {variants}
seeds = {seeds}
reference = "baseline"
"""


def cli(*args, cwd=ROOT):
    return cli_in_process(*args, cwd=cwd)


def write_suite(tmp_path, variants=("baseline", "additive_mask", "pre_norm"), seeds=2, name="t"):
    path = tmp_path / f"{name}.toml"
    path.write_text(TINY.format(variants=json.dumps(list(variants)), seeds=seeds))
    return path


def test_the_default_suite_names_every_builtin_variant_and_the_issue_tasks():
    spec = load_suite("default")
    assert spec.variants == ["all"] and spec.reference == "baseline" and spec.seeds >= 6
    assert spec.tasks == ["copy", "reverse", "sort", "copy_length"]


@pytest.mark.parametrize("text, message", [
    ('preset = "suite"\ntasks = ["copy"]\nvariants = ["all"]\nseeds = 0\nreference = "baseline"', "seeds must be"),
    ('preset = "suite"\ntasks = []\nvariants = ["all"]\nseeds = 2\nreference = "baseline"', "tasks must be"),
    ('preset = "suite"\ntasks = ["copy"]\nvariants = ["all"]\nseeds = 2\nreference = "baseline"\nsteps = 3',
     "unknown key(s) steps"),
    ('preset = "suite"\ntasks = ["copy"]\nvariants = ["all"]\nseeds = 2\nreference = "baseline"\nmetric = "x"',
     "metric must be"),
    ('preset = [', "not valid UTF-8 TOML"),
])
def test_bad_suite_files_are_refused_with_the_reason(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_suite(str(path))


def test_cli_refuses_an_unknown_suite_and_options_the_suite_file_owns(tmp_path):
    proc = cli("run", "--suite", "no_such_suite", "--results-dir", str(tmp_path))
    assert proc.returncode == 2 and "suite 'no_such_suite' not found" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    proc = cli("run", "--suite", "--seeds", "3", "--results-dir", str(tmp_path))
    assert proc.returncode == 2 and "--suite takes --seeds from the suite file" in proc.stderr
    assert not any(tmp_path.iterdir())  # nothing stored


def test_suite_end_to_end_then_resume_trains_nothing(tmp_path):
    path = write_suite(tmp_path)
    proc = cli("run", "--suite", str(path), "--results-dir", str(tmp_path), "--run-id", "s", "-q")
    assert proc.returncode == 0, proc.stderr[-2000:]
    folder = tmp_path / "s"
    for task in ("copy", "reverse"):  # each task is an ordinary run with its own report
        trials = pd.read_csv(folder / task / "trials.csv")
        assert len(trials) == 3 * 2 and set(trials["status"]) == {"ok"}
        assert set(trials["seed"]) == {0, 1}
        assert (folder / task / "report.md").is_file()
    table = pd.read_csv(folder / "suite.csv")
    assert len(table) == 6
    rel = dict(zip(table["variant"], table["relation"]))
    assert rel == {"baseline": "reference", "additive_mask": "check: same function", "pre_norm": "check: different"}
    # the suite's CE is the task run's CE: same numbers as that run's trials
    rev = pd.read_csv(folder / "reverse" / "trials.csv")
    base = table[(table["task"] == "reverse") & (table["variant"] == "baseline")].iloc[0]
    assert rev[rev["variant"] == "baseline"]["heldout_ce"].min() <= base["ce"] <= rev[rev["variant"] == "baseline"]["heldout_ce"].max()
    text = (folder / "suite.md").read_text()
    assert text.index("## Which variants compute the same function") < text.index("## Verdicts vs `baseline`")
    assert "- class 1: additive_mask, baseline" in text
    cells = pd.read_csv(folder / "suite.csv")["verdict"].fillna("")
    assert set(cells) <= {"", "no claim", "same function"}  # 2 pairs can never give a verdict
    assert set(table[table["variant"] == "additive_mask"]["verdict"]) == {"same function"}  # check: never compared
    assert "| additive_mask | check: same function | = same function (0-0-2t)" in text
    assert "**better** " not in text.split("## How the verdicts are made")[0]
    assert (folder / "suite_verdicts.png").stat().st_size > 1000
    before = {p: p.stat().st_mtime_ns for p in (folder / "copy" / "trials").iterdir()}
    proc = cli("run", "--suite", str(path), "--resume", str(folder), "-q")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "already complete, kept" in proc.stderr
    assert {p: p.stat().st_mtime_ns for p in (folder / "copy" / "trials").iterdir()} == before
    assert pd.read_csv(folder / "suite.csv").equals(table)


def test_a_leaking_plugin_in_a_suite_is_invalid_and_never_ranked(tmp_path):
    plugin = ROOT / "tests" / "plugins" / "adv_causal_shift.py"
    path = write_suite(tmp_path, variants=("baseline", "adv_causal_shift"), seeds=1)
    proc = cli("--plugin", str(plugin), "run", "--suite", str(path), "--results-dir", str(tmp_path), "--run-id", "s",
               "-q")
    assert proc.returncode == 1, proc.stderr[-2000:]  # the task runs exit 1: an invalid variant
    table = pd.read_csv(tmp_path / "s" / "suite.csv")
    mine = table[table["variant"] == "adv_causal_shift"]
    assert len(mine) == 2 and set(mine["verdict"]) == {"INVALID"}
    text = (tmp_path / "s" / "suite.md").read_text()
    assert "Not ranked (invalid: a mask leak or broken component): adv_causal_shift." in text
    assert "check reported" in text  # check saw the shifted mask too


def _frame(rows):
    base = {"n": 8, "n_ok": 8, "invalid": "", "ce": 0.4, "ce_low": 0.3, "ce_high": 0.5, "em": 0.5, "em_low": 0.4,
            "em_high": 0.6, "auc": 0.9, "reason": "", "p": 0.5, "p_low": 0.2, "p_high": 0.8, "ties": 0,
            "test_verdict": ""}
    return pd.DataFrame([{**base, **r} for r in rows])


def test_findings_and_negative_control_come_from_the_verdicts():
    spec = SuiteSpec(name="x", preset="suite", tasks=["reverse", "sort"], variants=["all"], seeds=8,
                     reference="baseline")
    df = _frame([
        {"task": t, "variant": "baseline", "relation": "reference", "changed": "", "verdict": "", "wins": 0, "losses": 0}
        for t in spec.tasks] + [
        {"task": "reverse", "variant": "pre_norm", "relation": "check: different", "changed": "norm=pre",
         "verdict": "better", "wins": 8, "losses": 0, "reason": "sign test 8-0, p = 0.008"},
        {"task": "sort", "variant": "pre_norm", "relation": "check: different", "changed": "norm=pre",
         "verdict": "no claim", "wins": 5, "losses": 3},
        # a same-function variant is never a verdict; where the sign test alone would have given one, the
        # negative control counts it as a false positive
        {"task": "sort", "variant": "twin", "relation": "check: same function", "changed": "mask=additive",
         "verdict": "same function", "test_verdict": "worse", "wins": 0, "losses": 8, "p": 0.0, "p_low": 0.0,
         "p_high": 0.32, "reason": "sign test 0-8, p = 0.008"},
        {"task": "reverse", "variant": "twin", "relation": "check: same function", "changed": "mask=additive",
         "verdict": "same function", "test_verdict": "no claim", "wins": 4, "losses": 4}])
    lines = "\n".join(suite_report.findings(df, spec))
    assert "- **reverse**: better: pre_norm (norm=pre, 8-0) — same function (check): twin" in lines
    assert "- **sort**: no claim: pre_norm — same function (check): twin" in lines
    assert "`norm=pre` alone: better on reverse; no claim on sort" in lines and "mask=additive" not in lines
    control = "\n".join(suite_report.negative_control(df, spec))
    assert "Observed: **1**" in control and "FALSE POSITIVE of the sign test alone (not reported as a verdict): " \
        "twin on sort: worse" in control
    sections = suite_report.verdict_sections(df, spec)
    table, p_table = sections[4], sections[10]
    assert "**better** 8-0" in table and "no claim 5-3" in table
    assert "= same function (0-8)" in table and "**worse**" not in table  # never a verdict ...
    twin_p = [ln for ln in p_table.splitlines() if ln.startswith("| twin")]
    assert twin_p and "0.00" not in twin_p[0] and "| =" in twin_p[0]  # ... nor a probability


def test_collect_marks_the_references_check_class_same_function(tmp_path):
    """The suite's typed rows: a variant in the reference's class that wins every seed by rounding-sized
    margins is "same function" with its raw test kept; one outside the class gets its verdict."""
    from harness.suite.run import collect

    from .test_report_compare import TWIN_ARMS, make_run

    store = make_run(tmp_path, "copy", TWIN_ARMS, jitter=0.0)
    store.write_tables()
    spec = SuiteSpec(name="x", preset="tiny", tasks=["copy"], variants=["all"], seeds=6, reference="baseline")
    df = collect(spec, tmp_path, [["baseline", "twin"], ["pre_norm"]]).set_index("variant")
    assert df.loc["twin", "relation"] == "check: same function" and df.loc["twin", "verdict"] == "same function"
    assert df.loc["twin", "test_verdict"] == "better" and df.loc["twin", "wins"] == 6  # the negative control's input
    assert df.loc["pre_norm", "relation"] == "check: different" and df.loc["pre_norm", "verdict"] == "better"
    assert df.loc["twin", "ce"] == pytest.approx(store.meta() and trials_ce(tmp_path / "copy", "twin"))
    control = "\n".join(suite_report.negative_control(df.reset_index(), spec))
    assert "Observed: **1**" in control and "twin on copy: better" in control


def trials_ce(folder, variant):
    t = pd.read_csv(folder / "trials.csv")
    return stats.iqm(t[t["variant"] == variant]["heldout_ce"].to_numpy())


def test_null_verdict_rate_is_the_sign_tests_size():
    # two equal variants: each pair a fair coin; a verdict needs a clean sweep at 6..8 pairs
    assert suite_report.null_verdict_rate(6) == pytest.approx(2 / 2 ** 6)
    assert suite_report.null_verdict_rate(8) == pytest.approx(2 / 2 ** 8)
    assert suite_report.null_verdict_rate(10) == pytest.approx(2 * (1 + 10) / 2 ** 10)  # 10-0 and 9-1
    assert suite_report.null_verdict_rate(5) == 0.0


def test_heldout_auc_is_the_mean_heldout_loss_over_training():
    # held-out losses 2, 1, 1 at steps 50, 100, 200: trapezoids 50 * 1.5 + 100 * 1.0 = 175 over 150 steps
    assert stats.curve_mean([50, 100, 200], [2.0, 1.0, 1.0]) == pytest.approx(175 / 150)
    assert math.isnan(stats.curve_mean([200], [1.0]))



def test_run_records_the_same_classes_as_the_whole_check(registry):
    """``run`` records check's classes from the pair comparisons only; they equal the whole check's."""
    from harness.overview import check_classes

    variants = registry.select(["all"])
    quick, full = check_classes(registry, variants), check_classes(registry, variants, full=True)
    assert quick["scope"] == "pairs" and full["scope"] == "full"
    assert quick["classes"] == full["classes"]
    assert ["additive_mask", "baseline", "d2l_attention", "torch_attention"] in quick["classes"]
