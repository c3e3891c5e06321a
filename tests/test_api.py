"""The Python API from a notebook-style script: the README's "Python API" example runs as
written, and ``load_run`` gives the numbers report.md shows."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

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
    assert set(result.curves.split) == {"train", "dev"}
    assert isinstance(ns["model"], torch.nn.Module) and ns["outcome"].ok
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
    with pytest.raises(harness.HarnessError, match="--dtype must be one of fp32, bf16"):
        harness.run(variants="baseline", dtype="fp64", results_dir=tmp_path)
    with pytest.raises(harness.HarnessError, match="--retry-failed needs --resume"):
        harness.launch.start_run(harness.request.RunRequest(retry_failed=True, results_dir=str(tmp_path)))
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


def _example_env() -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HARNESS_DISABLE_PLUGIN_AUTOLOAD="1")
    env.pop("PYTEST_XDIST_WORKER", None)
    return env


#: appended to the example: its summary holds numbers (the bug printed a summary of NaN)
_FINITE = 'print("finite:", bool(summary["heldout_ce"].notna().all() and summary["exact_match"].notna().all()))\n'


def test_readme_example_as_a_plain_script(tmp_path):
    """The README's example pasted into example.py (no __main__ guard) and run with `python example.py`:
    the workers must not re-run the script (before the fix: one run folder per worker, multiprocessing
    tracebacks and an all-NaN summary, exit 0)."""
    (tmp_path / "example.py").write_text(_readme_example() + _FINITE)
    cores = os.cpu_count() or 1
    proc = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=_example_env(), capture_output=True,
                          text=True, timeout=600,  # every core, as a user's script has (xdist pins its workers)
                          preexec_fn=lambda: os.sched_setaffinity(0, range(cores)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "RuntimeError" not in proc.stderr, proc.stderr[-2000:]
    runs = [p.name for p in (tmp_path / "results").iterdir() if (p / "trials.csv").is_file()]
    assert len(runs) == 1, sorted(p.name for p in (tmp_path / "results").iterdir())
    meta = json.loads((tmp_path / "results" / runs[0] / "config.json").read_text())
    assert meta["execution"]["jobs"] == min(2, cores)  # two trials on a CPU: in worker processes where cores allow
    assert "baseline" in proc.stdout and "finite: True" in proc.stdout


def test_readme_example_in_a_jupyter_kernel(tmp_path):
    """The same example as one notebook cell, executed in a real IPython kernel (nbclient)."""
    import nbclient  # the test extra installs nbclient, nbformat and ipykernel: a missing one fails here
    import nbformat
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(_readme_example() + _FINITE),
                                         nbformat.v4.new_code_cell("print(len(list(harness.load_run('latest')"
                                                                   ".trials.variant)))")])
    old = dict(os.environ)
    os.environ.update(_example_env())
    os.environ.pop("PYTEST_XDIST_WORKER", None)
    try:
        nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
                                ).execute()
    finally:
        os.environ.clear()
        os.environ.update(old)
    outputs = [o for cell in nb.cells for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"], outputs
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream" and o.get("name") == "stdout")
    assert "baseline" in text and "finite: True" in text and text.strip().endswith("2")
    folders = [p.name for p in (tmp_path / "results").iterdir() if p.is_dir()]
    assert "checks" in folders and len(folders) == 2  # harness.check's record and the one run


def test_a_run_whose_trials_all_fail_raises(tmp_path):
    """No table of NaN: a run none of whose trials finished ok raises, and keeps the failures on disk."""
    plugin = tmp_path / "broken.py"
    plugin.write_text("from torch import nn\nfrom harness import Component, Variant, hookimpl\n\n"
                      "class Broken(nn.Module):\n    final_norm = False\n\n"
                      "    def __init__(self, ctx):\n        super().__init__()\n        self.norm = ctx.layer_norm()\n\n"
                      "    def forward(self, x, sublayer):\n        raise RuntimeError('broken on purpose')\n\n"
                      "@hookimpl\ndef harness_add_components():\n"
                      "    return [Component('broken', 'norm', Broken, 'raises', equivalent_to='post')]\n\n"
                      "@hookimpl\ndef harness_add_variants():\n    return [Variant('broken', {'norm': 'broken'})]\n")
    with pytest.raises(harness.RunFailedError, match="none of the 1 trial.*broken on purpose"):
        harness.run(variants="broken", preset="tiny", overrides={"train.steps": 5}, plugin_files=[plugin],
                    results_dir=tmp_path / "results", jobs=1)
    (run,) = (tmp_path / "results").iterdir()
    assert (run / "trials.csv").is_file()
