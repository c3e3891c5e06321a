"""Metrics declared by the task (harness/metrics.py, ``Task.metrics``, ``Task.primary_metric``).

A plugin task's own metric (tests/plugins/task_metric.py: ``heldout_bits``) reaches the trials table,
the report, ``--metric`` and ``compare`` from its declaration alone; the meta-test holds that every
metric a registered task declares has its docs entry and a test naming it.
"""
from __future__ import annotations

import math
import re

import pandas as pd
import pytest

import harness
from harness.cli import main
from harness.errors import PluginError
from harness.metrics import BUILTIN, COPY_METRICS, G2P_METRICS, Metric
from harness.registry import Registry
from harness.report import terminal_table
from harness.store import RunStore
from harness.tasks.copy import CopyTask
from harness.tboard import final_names
from harness.testing import load_registry

from .conftest import ROOT

PLUGIN = ROOT / "tests" / "plugins" / "task_metric.py"


@pytest.fixture(scope="module")
def bits_run(tmp_path_factory):
    """One tiny run of the plugin task ``copy_bits`` (2 seeds, 6 steps): its folder."""
    return harness.run(variants=["baseline"], task="copy_bits", preset="tiny", seeds=2, check=False,
                       overrides={"train.steps": 6, "train.eval_every": 3}, plugin_files=[str(PLUGIN)],
                       results_dir=str(tmp_path_factory.mktemp("bits")), device="cpu", jobs=1)


def test_a_plugin_metric_reaches_the_trials_table_report_and_compare(bits_run, capsys):
    trials = pd.read_csv(bits_run / "trials.csv")
    assert len(trials) == 2 and set(trials.status) == {"ok"}
    assert all(math.isclose(b, ce / math.log(2), rel_tol=1e-9) for b, ce in zip(trials.heldout_bits, trials.heldout_ce))
    # its dev value beside it, named as the shared ones are (heldout_ce -> dev_ce, heldout_bits -> dev_bits)
    assert all(math.isclose(b, ce / math.log(2), rel_tol=1e-9) for b, ce in zip(trials.dev_bits, trials.dev_ce))
    curves = pd.read_csv(bits_run / "curves.csv")
    held = curves[curves.split == "dev"]
    assert held.heldout_bits.notna().all()  # every evaluation's curve row
    for seed, g in held.groupby("seed"):  # heldout_auc: the trapezoid mean of the held-out CE curve
        x, y = g.step.to_numpy(float), g.loss.to_numpy(float)
        auc = ((y[1:] + y[:-1]) / 2 * (x[1:] - x[:-1])).sum() / (x[-1] - x[0])
        assert math.isclose(float(trials.set_index("seed").heldout_auc[seed]), auc, rel_tol=1e-9)
    report = (bits_run / "report.md").read_text()
    assert "held-out bits IQM [95% CI]" in report  # the declared column header
    assert "compares on **heldout_bits**" in report  # the task's primary metric, without --metric
    assert "held-out cross-entropy in bits (heldout_ce / ln 2); bits/token, lower is better" in report  # caption
    assert "time to EM≥0.99 s (median)" in report  # the copy-task columns it inherits stay
    loaded = harness.load_run(bits_run)
    assert "heldout_bits" in set(loaded.summary.columns) and loaded.metric == "heldout_bits"
    shown = terminal_table(loaded.table).splitlines()[0]  # the terminal keeps it, " IQM" dropped as for CE
    assert "held-out bits" in shown and "held-out CE" in shown and "IQM" not in shown
    stored = RunStore(bits_run).load_trials()[0]
    assert final_names(stored)[-1] == "heldout_bits" and "exact_match_method" not in final_names(stored)

    assert main(["report", str(bits_run), "--metric", "heldout_ce", "-q"]) == 0
    assert "compares on **heldout_ce**" in (bits_run / "report.md").read_text()
    assert main(["report", str(bits_run), "--metric", "wer", "-q"]) == 2  # not a metric this task declares
    assert "unknown metric 'wer' for --metric; expected one of" in capsys.readouterr().err

    table = harness.compare(bits_run, bits_run).table  # the default gate holds the task's own metric
    assert "heldout_bits" in set(table.metric)
    assert main(["compare", str(bits_run), str(bits_run), "--metric", "heldout_bits"]) == 0
    out = capsys.readouterr().out
    assert "heldout_bits" in out and "heldout_ce" not in out


def test_metric_declarations_refuse_bad_values():
    with pytest.raises(ValueError, match="must be a Python identifier"):
        Metric("held-out bits", False, "bits", "x")
    with pytest.raises(ValueError, match="unknown place"):
        Metric("bits", False, "bits", "x", show=("table", "poster"))
    with pytest.raises(ValueError, match="summarised by its IQM"):
        Metric("bits", False, "bits", "x", stat="median_iqr")  # only shared metrics have other summaries


def test_the_registry_refuses_a_primary_metric_the_task_does_not_declare_for_verdicts():
    class NoSuchPrimary(CopyTask):
        name, plugin, primary_metric = "copy_x", "test", "bleu"

    class UnusablePrimary(CopyTask):
        name, plugin, primary_metric = "copy_y", "test", "heldout_auc"  # declared, but verdict=False

    for task in (NoSuchPrimary(), UnusablePrimary()):
        with pytest.raises(PluginError, match=f"primary_metric {task.primary_metric!r}"):
            Registry(tasks=[task])


def test_g2p_declares_wer_primary_and_drops_the_solved_columns():
    reg = Registry.from_plugins()
    g2p, copy = reg.task("g2p"), reg.task("copy")
    assert (g2p.primary_metric, copy.primary_metric) == ("wer", "heldout_ce")
    names = [m.name for m in g2p.metrics]
    assert {"wer", "per"} <= set(names) and not {"steps_to_solve", "time_to_solve_s"} & set(names)
    assert [m.name for m in copy.metrics] == [m.name for m in COPY_METRICS]


# ----------------------------------------------------------------------------- the meta-test

DOCS = ROOT / "docs" / "statistics.md"


def undocumented(metrics, docs: str, tests: dict[str, str]) -> list[str]:
    """One line per declared metric that lacks a row of docs/statistics.md's metrics table
    (``| `name` |``) or a test file that names it."""
    rows = set(re.findall(r"^\| `([a-z_0-9]+)` \|", docs, flags=re.M))
    out = []
    for m in metrics:
        if m.name not in rows:
            out.append(f"{m.name}: no row in docs/statistics.md's metrics table")
        if not any(re.search(rf"\b{m.name}\b", text) for text in tests.values()):
            out.append(f"{m.name}: no test names it")
    return out


def _test_texts() -> dict[str, str]:
    return {p.name: p.read_text() for p in (ROOT / "tests").glob("test_*.py")}


def test_every_declared_metric_has_its_docs_entry_and_a_test():
    reg = Registry.from_plugins()
    declared = {m.name: m for t in reg.tasks.values() for m in t.metrics}
    assert set(declared) == set(BUILTIN)  # the built-in tasks declare exactly the built-in metrics
    assert undocumented(declared.values(), DOCS.read_text(), _test_texts()) == []


def test_the_meta_test_flags_a_metric_without_docs_or_test():
    """A plugin metric planted without a docs row nor a test: both defects named; its row alone
    leaves the missing test."""
    bits = load_registry(files=[PLUGIN]).task("copy_bits").metrics[-1]
    docs, tests = DOCS.read_text(), _test_texts()
    assert undocumented([bits], docs, {}) == ["heldout_bits: no row in docs/statistics.md's metrics table",
                                               "heldout_bits: no test names it"]
    assert undocumented([bits], docs + "\n| `heldout_bits` | bits |\n", {}) == ["heldout_bits: no test names it"]
    assert undocumented(G2P_METRICS, docs, tests) == []


def test_a_suite_refuses_a_metric_one_of_its_tasks_does_not_declare_before_training(tmp_path):
    from harness.errors import ConfigError
    from harness.suite.run import run_suite
    from harness.suite.spec import SuiteSpec

    reg = Registry.from_plugins()
    spec = SuiteSpec(name="x", preset="tiny", tasks=["g2p", "copy"], variants=["baseline"], seeds=2,
                     reference="baseline", metric="wer")
    with pytest.raises(ConfigError, match="task 'copy' does not declare the metric 'wer'"):
        run_suite(spec, tmp_path / "suite", reg, [reg.variants["baseline"]], base=None)
    assert not (tmp_path / "suite").exists()  # nothing trained, nothing written


def test_an_experiment_metric_is_checked_against_its_tasks_declarations(tmp_path):
    """A plugin task's own metric is accepted in an experiment file that names the task; a metric the
    task does not declare is refused when the plan is made (before anything trains)."""
    from harness.experiments.plan import plan_from_experiment
    from harness.experiments.spec import ExperimentError
    from harness.request import RunRequest

    reg = load_registry(files=[PLUGIN])
    body = 'description = "x"\nvariants = ["baseline"]\nseeds = 2\npreset = "tiny"\ntask = "{task}"\nmetric = "{metric}"\n'
    for task, metric, ok in (("copy_bits", "heldout_bits", True), ("copy", "heldout_bits", False), ("g2p", "wer", True)):
        path = tmp_path / f"{task}_{metric}.toml"
        path.write_text(body.format(task=task, metric=metric))
        if ok:
            assert plan_from_experiment(str(path), reg, RunRequest()).variants[0].name == "baseline"
        else:
            with pytest.raises(ExperimentError, match="a metric task 'copy' declares"):
                plan_from_experiment(str(path), reg, RunRequest())


def test_the_docs_show_the_plugin_file_as_it_is():
    """docs/tasks.md's "A task with its own metric" code is the test plugin's code (docstring trimmed)."""
    docs = (ROOT / "docs" / "tasks.md").read_text()
    section = docs.split("## A task with its own metric", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    source = PLUGIN.read_text()
    body = source.split("from __future__ import annotations\n\n", 1)[1]
    trimmed = re.sub(r'\n    """[^\n]*"""\n\n', "\n", body)  # the class docstring and its blank line
    assert code.strip() == trimmed.strip()
