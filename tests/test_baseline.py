"""The baseline every variant is compared with: chosen once when a run starts (``--baseline``, the
variant named ``baseline``, an experiment's, the grid's), recorded in config.json, named in report.md,
kept on resume; a run stored before it was recorded keeps its first variant, with a note."""
import json

import pytest

from harness.errors import ConfigError
from harness.report import choose_baseline, summary_table, trials_frame, write_report

from .conftest import cli_in_process
from .test_report_compare import make_run

TINY = ["--preset", "tiny", "--set", "train.steps=4", "--set", "train.eval_every=4", "--seeds", "1",
        "--device", "cpu", "--no-check", "--jobs", "1"]


def test_choose_baseline_takes_the_request_then_the_preferred_then_baseline_else_refuses():
    assert choose_baseline(None, ["a", "baseline", "z"]) == "baseline"
    assert choose_baseline("z", ["a", "baseline", "z"]) == "z"
    assert choose_baseline(None, ["a", "g", "z"], preferred="g") == "g"
    with pytest.raises(ConfigError):  # a preferred name the run does not hold is no choice
        choose_baseline(None, ["a", "z"], preferred="missing")
    assert choose_baseline(None, ["only"]) == "only" and choose_baseline(None, []) is None
    with pytest.raises(ConfigError) as e:
        choose_baseline(None, ["pre_norm", "alibi_positions"])
    assert "--baseline" in str(e.value) and "pre_norm, alibi_positions" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"--baseline 'Baseline' is not a variant of this run \(variants: baseline"):
        choose_baseline("Baseline", ["baseline", "pre_norm"])  # no case folding: the name as listed
    with pytest.raises(ConfigError, match=r"\(variants: .*\.\.\. \(30 in all\)\)$"):
        choose_baseline(None, [f"v{i:02d}" for i in range(30)])


def test_the_grid_compares_with_its_variant_that_holds_the_baselines_components():
    from harness.planning import load_registry, plan_run
    from harness.runner import plan_baseline
    from harness.plugins import PluginSpec
    from harness.request import RunRequest

    reg = load_registry(PluginSpec())
    req = RunRequest(grid=True, preset="tiny")
    plan = plan_run(req, reg)
    chosen = plan_baseline(req, reg, plan)
    assert chosen != sorted(v.name for v in plan.variants)[0]  # not the alphabetically first
    base = reg.variants["baseline"].resolved(reg.defaults or None)
    assert next(v for v in plan.variants if v.name == chosen).resolved(reg.defaults or None) == base
    assert plan_baseline(RunRequest(grid=True, baseline=plan.variants[-1].name), reg, plan) == plan.variants[-1].name


def test_run_without_a_baseline_variant_must_choose_and_records_the_choice(tmp_path, monkeypatch):
    variants = ["--variants", "pre_norm", "alibi_positions", "--results-dir", str(tmp_path)]
    r = cli_in_process("run", *variants, *TINY, "--run-id", "nochoice")
    assert r.returncode == 2, r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "--baseline" in err[0] and "alibi_positions, pre_norm" in err[0], r.stderr
    assert not (tmp_path / "nochoice").exists()  # refused before anything is stored

    monkeypatch.setenv("COLUMNS", "80")
    r = cli_in_process("run", *variants, *TINY, "--run-id", "a", "--baseline", "pre_norm")
    assert r.returncode == 0, r.stderr
    run = tmp_path / "a"
    assert json.loads((run / "config.json").read_text())["baseline"] == "pre_norm"
    report = (run / "report.md").read_text()
    assert "Baseline: `pre_norm` (the run's choice" in report and "P(> pre_norm)" in report
    assert "P(> alibi_positions)" not in report  # today's silent choice was the alphabetically first
    # at 80 columns the per-trial lines (the file named from the run folder, wrapped) and the table fit
    trial_lines = [ln for ln in r.stderr.splitlines() if " seed 0: ok" in ln or ln.startswith("    ")]
    table = [ln for ln in r.stdout.splitlines() if ln.startswith("|")]
    assert len(trial_lines) >= 2 and len(table) >= 4 and max(map(len, trial_lines + table)) <= 80, r.stderr + r.stdout

    # --resume keeps the stored baseline: another one is refused in one line, the same one goes on
    r = cli_in_process("run", "--resume", str(run), "--baseline", "alibi_positions")
    assert r.returncode == 2 and "'pre_norm'" in r.stderr and "report" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = cli_in_process("run", "--resume", str(run), "--baseline", "pre_norm")
    assert r.returncode == 0, r.stderr
    assert json.loads((run / "config.json").read_text())["baseline"] == "pre_norm"


def test_an_old_run_without_a_recorded_baseline_keeps_its_first_variant_and_says_so(tmp_path):
    store = make_run(tmp_path, "old", {"pre_norm": (0.5, 0.9, ()), "alibi_positions": (0.4, 0.9, ())}, seeds=2)
    assert store.meta().baseline is None
    text = write_report(store).read_text()
    assert "P(> alibi_positions)" in text  # the first variant, as before the choice was recorded
    assert "this run recorded no baseline" in text and "report RUN --baseline NAME" in text
    # asked for (report --baseline, an experiment's), even the first variant is a choice: no note
    text = write_report(store, baseline="alibi_positions").read_text()
    assert "Baseline: `alibi_positions`." in text and "recorded no baseline" not in text


def test_a_recorded_baseline_wins_over_a_variant_named_baseline(tmp_path):
    """A run that chose ``pre_norm`` and also holds ``baseline``: re-rendering keeps ``pre_norm``."""
    store = make_run(tmp_path, "r", {"baseline": (0.5, 0.9, ()), "pre_norm": (0.4, 0.9, ())}, seeds=2)
    meta = store.meta()
    meta.baseline = "pre_norm"
    store.write_meta(meta)
    table = summary_table(trials_frame(store), meta=store.meta())
    assert list(table["variant"])[0] == "pre_norm" and "P(> pre_norm) [95% CI]" in table
    text = write_report(store).read_text()
    assert "Baseline: `pre_norm` (the run's choice" in text and "P(> baseline)" not in text
