"""The Python API from a notebook-style script: the README's "Python API" example runs as
written, and ``load_run`` gives the numbers report.md shows."""
from __future__ import annotations

import re

import pytest
import torch

import harness
from harness import stats

from .conftest import ROOT


def _readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Python API", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return block


def _results_table(report_md: str) -> list[dict[str, str]]:
    """report.md's results table (the first table after '## Results') as dicts of cells."""
    lines = [ln for ln in report_md.split("## Results", 1)[1].splitlines() if ln.startswith("|")]
    rows = []
    for ln in lines:
        if set(ln) <= set("|-: "):
            continue
        rows.append([c.strip() for c in ln.strip("|").split("|")])
        if len(rows) > 1 and not lines[lines.index(ln) + 1:]:
            break
    header, body = rows[0], rows[1:]
    return [dict(zip(header, r)) for r in body]


def _numbers(cell: str) -> list[float]:
    return [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?", cell)]


def test_readme_example_runs_and_load_run_matches_report_md(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    ns: dict = {"__name__": "notebook"}
    exec(compile(_readme_example(), "README.md Python API", "exec"), ns)
    result = ns["result"]
    assert result.path == ns["run_dir"] and result.path.parent == tmp_path / "results"
    assert sorted(zip(result.trials.variant, result.trials.seed)) == [("baseline", 0), ("pre_norm", 0)]
    assert set(result.curves.split) == {"train", "heldout"}
    assert isinstance(ns["model"], torch.nn.Module) and ns["report"].ok
    report_md = (result.path / "report.md").read_text()
    assert "python -m harness run --variants baseline pre_norm" in report_md  # the equivalent command line
    table = {row["variant"]: row for row in _results_table(report_md)}
    summary = result.summary.set_index("variant")
    assert sorted(table) == sorted(summary.index) == ["baseline", "pre_norm"]
    for variant, row in table.items():
        s = summary.loc[variant]
        assert int(row["params"]) == s["params"]
        for column, metric in (("held-out CE IQM [95% CI]", "heldout_ce"), ("exact-match IQM [95% CI]", "exact_match")):
            shown = stats.fmt_ci(s[metric], s[f"{metric}_low"], s[f"{metric}_high"])
            assert _numbers(row[column]) == _numbers(shown), (variant, column)  # tabulate writes 0.000 as 0
        assert float(row["step ms"]) == round(s["step_ms"], 1)
    assert result.table.set_index("variant").loc["pre_norm", "verdict"] == table["pre_norm"]["verdict"]
    assert capsys.readouterr().out.count("\n") <= 5  # only the example's own print


def test_run_bad_input_raises_and_stores_nothing(tmp_path):
    with pytest.raises(harness.HarnessError, match="did you mean 'baseline'"):
        harness.run(variants="baselin", preset="tiny", results_dir=tmp_path)
    with pytest.raises(harness.HarnessError, match="seeds"):
        harness.run(variants="baseline", seeds=0, preset="tiny", results_dir=tmp_path)
    with pytest.raises(harness.HarnessError, match="invalid choice"):
        harness.run(variants="baseline", dtype="fp64", results_dir=tmp_path)
    assert not any(tmp_path.iterdir())


def test_build_model_as_create_model():
    a = harness.build_model("baseline", harness.ModelConfig(N=1, d_model=16, h=2, d_ff=32), seed=3)
    b = harness.build_model("baseline", {"N": 1, "d_model": 16, "h": 2, "d_ff": 32}, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    src, tgt = torch.randint(3, 11, (2, 5)), torch.randint(3, 11, (2, 4))
    assert a(src, tgt).shape == (2, 4, 11)
    assert isinstance(harness.build_model("pre_norm", "tiny"), torch.nn.Module)
    with pytest.raises(harness.HarnessError, match="did you mean"):
        harness.build_model("pre_nrom")
