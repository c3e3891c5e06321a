"""One spelling, "vectorise", and the old "vectorize" still read (issue 50, item 6).

The project spells it "vectorise" in code, options, columns and docs. What users already have keeps
working: the ``run`` flag ``--vectorize-seeds`` (a hidden alias), a ``config.json`` whose
``execution`` holds ``vectorize_seeds``, and trial rows (trial files, ``trials.csv``) with the columns
``vectorized`` / ``vectorized_note``, as every committed reference run made before the rename has.
This file is the one test file that spells them the old way; :func:`test_the_tree_spells_vectorise_one_way`
holds every other file to the new spelling, with a short list of documented exceptions.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from harness.runmeta import OLD_VECTORISE_FLAG, Execution
from harness.store import RunStore, load_run
from harness.suite.run import task_frame
from harness.trial import OLD_COLUMNS, TrialResult, current_header
from harness.verification import verify_run

from .conftest import ROOT, cli_in_process

#: A committed reference run stored before the rename (16 seeds trained as one group on a GPU).
OLD_RUN = ROOT / "results" / "reference" / "gpu-h200" / "g2p16-cuda"
#: A suite task's committed run, likewise old (the suite reads its trials.csv directly).
OLD_SUITE_TASK = ROOT / "results" / "reference" / "suite-tuned" / "sort"

TINY = ["--variants", "baseline", "--preset", "tiny", "--seeds", "2", "--device", "cpu", "--threads", "1",
        "--set", "train.steps=3", "--set", "train.eval_sequences=16", "--no-check", "-q"]


def test_the_old_names_are_the_ones_stored_runs_hold():
    """The aliases name exactly what the old runs hold (a renamed alias would read nothing)."""
    stored = json.loads((OLD_RUN / "config.json").read_text())
    assert stored["execution"]["vectorize_seeds"] == "on" and "vectorise_seeds" not in stored["execution"]
    assert OLD_VECTORISE_FLAG in stored["command"]
    header = (OLD_RUN / "trials.csv").read_text().splitlines()[0].split(",")
    assert "vectorized" in header and "vectorised" not in header
    assert OLD_COLUMNS == {"vectorized": "vectorised", "vectorized_note": "vectorised_note"}


def test_a_run_stored_with_the_old_spelling_reads_verifies_and_reports(tmp_path):
    """The old run loads with today's names, config.json round-trips as stored, verify passes before
    and after ``report`` re-renders trials.csv (then with today's column), and verify still catches a
    changed value under the old header."""
    run = tmp_path / "old"
    shutil.copytree(OLD_RUN, run)
    stored = json.loads((run / "config.json").read_text())
    loaded = load_run(run)
    assert loaded.meta.execution.vectorise_seeds == "on" and loaded.meta.to_dict() == stored
    assert len(loaded.trials) == 16
    assert all(t.row["vectorised"] == 16 and "vectorized" not in t.row for t in loaded.trials)
    assert verify_run(RunStore(run))[0] == []
    old_table = (run / "trials.csv").read_text()
    lines = old_table.splitlines(keepends=True)
    (run / "trials.csv").write_text(lines[0] + lines[1].replace(",16,", ",15,", 1) + "".join(lines[2:]))
    problems = verify_run(RunStore(run))[0]
    assert len(problems) == 1 and problems[0].startswith("trials.csv: does not match the trial files"), problems
    (run / "trials.csv").write_text(old_table)
    r = cli_in_process("report", run)
    assert r.returncode == 0, r.stderr
    header = (run / "trials.csv").read_text().splitlines()[0].split(",")
    assert "vectorised" in header and "vectorized" not in header
    assert (run / "trials.csv").read_text() == current_header(old_table)
    assert verify_run(RunStore(run))[0] == []


def test_old_row_columns_read_under_todays_names_in_place():
    row = {"variant": "baseline", "seed": 0, "status": "ok", "vectorized": 4, "vectorized_note": "why", "wall_s": 1.0}
    got = TrialResult.from_dict({"row": row, "curve": []}).row
    assert list(got) == ["variant", "seed", "status", "vectorised", "vectorised_note", "wall_s"]
    assert got["vectorised"] == 4 and got["vectorised_note"] == "why"
    assert "vectorised" in task_frame(OLD_SUITE_TASK).columns  # the suite reads trials.csv itself


def test_an_old_execution_key_reads_as_the_field_and_is_written_back_as_stored():
    old = {"executor": "local", "jobs": 1, "threads": 1, "address": None, "vectorize_seeds": "on", "capture": "auto"}
    ex = Execution.from_dict(old)
    assert ex.vectorise_seeds == "on" and ex.extra == {} and ex.to_dict() == old
    assert list(ex.to_dict()) == list(old)
    new = Execution("local", 1, 1, None, "off", "auto")
    assert new.to_dict()["vectorise_seeds"] == "off" and "vectorize_seeds" not in new.to_dict()
    both = Execution.from_dict({**old, "vectorise_seeds": "off"})  # today's key wins; the old one is kept as is
    assert both.vectorise_seeds == "off" and both.extra == {"vectorize_seeds": "on"}


def test_the_old_flag_trains_a_trial_group_and_a_resume_keeps_the_stored_spelling(tmp_path):
    """``--vectorize-seeds on`` is ``--vectorise-seeds on``; a run whose config.json has the old key
    resumes with the stored choice, and its config.json keeps the old key (today's under ``resumes``)."""
    r = cli_in_process("run", *TINY, OLD_VECTORISE_FLAG, "on", "--results-dir", tmp_path, "--run-id", "old")
    assert r.returncode == 0, r.stderr
    run = tmp_path / "old"
    meta = json.loads((run / "config.json").read_text())
    assert meta["execution"]["vectorise_seeds"] == "on" and "vectorize_seeds" not in meta["execution"]
    assert [t.row["vectorised"] for t in load_run(run).trials] == [2, 2]
    meta["execution"]["vectorise_seeds"] = "off"  # as a run stored before the rename, with the other choice
    meta["execution"] = {("vectorize_seeds" if k == "vectorise_seeds" else k): v for k, v in meta["execution"].items()}
    (run / "config.json").write_text(json.dumps(meta, indent=2))
    (run / "trials" / "baseline__s1.json").unlink()
    r = cli_in_process("run", "--resume", run, "-q")
    assert r.returncode == 0, r.stderr
    after = json.loads((run / "config.json").read_text())
    assert after["execution"]["vectorize_seeds"] == "off" and "vectorise_seeds" not in after["execution"]
    assert after["resumes"][-1]["execution"]["vectorise_seeds"] == "off"
    assert "vectorised" not in {t.row["seed"]: t.row for t in load_run(run).trials}[1]  # trained alone: "off"


def test_harness_run_reads_the_old_keyword(tmp_path):
    import harness

    folder = harness.run("baseline", seeds=2, preset="tiny", overrides={"train.steps": 3, "train.eval_sequences": 16},
                         device="cpu", threads=1, check=False, vectorize_seeds="on", results_dir=tmp_path, run_id="api")
    assert json.loads((folder / "config.json").read_text())["execution"]["vectorise_seeds"] == "on"
    assert [t.row["vectorised"] for t in load_run(folder).trials] == [2, 2]


def test_a_bad_value_for_the_old_flag_is_one_line_exit_2(tmp_path):
    r = cli_in_process("run", *TINY, OLD_VECTORISE_FLAG, "yes", "--results-dir", tmp_path)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert OLD_VECTORISE_FLAG in r.stderr and not list(tmp_path.iterdir())


# ------------------------------------------------------------------- one spelling in the tree

#: Where the tree may still spell it with a z, and why: the aliases above (each documented), and
#: names the project does not own (scipy's keyword, CUDA kernel names matched by the profiler).
ALLOWED = {
    "harness/runmeta.py": {"--vectorize-seeds", "vectorize_seeds"},  # OLD_VECTORISE_FLAG; Execution's old key
    "harness/trial.py": {"vectorized", "vectorized_note"},  # OLD_COLUMNS
    "harness/api.py": {"vectorize_seeds"},  # harness.run's old keyword
    "harness/stats.py": {"vectorized"},  # scipy.stats.bootstrap(vectorized=True)
    "harness/perf/kernels.py": {"vectorized"},  # a fragment of CUDA kernel names (vectorized_elementwise_kernel)
    "tests/test_bench.py": {"vectorized_elementwise_kernel"},  # CUDA kernel names the profiler reports
    "docs/running.md": {"--vectorize-seeds", "vectorize_seeds", "vectorized", "vectorized_note"},  # the aliases
}
SCANNED = ("harness", "tests", "docs", "README.md", "experiments")
WORD = re.compile(r"[-\w]*vectoriz[-\w]*", re.IGNORECASE)


def old_spellings(root: Path, allowed: dict[str, set[str]], skip: tuple[str, ...] = ()) -> dict[str, set[str]]:
    """``{file: words}`` of every word with "vectoriz" under ``root``'s :data:`SCANNED` paths (text
    files) that ``allowed`` does not allow for that file; ``skip``: files not scanned."""
    found: dict[str, set[str]] = {}
    for top in SCANNED:
        base = root / top
        for path in ([base] if base.is_file() else sorted(base.rglob("*")) if base.is_dir() else []):
            rel = path.relative_to(root).as_posix()
            if not path.is_file() or rel in skip or "__pycache__" in rel:
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue
            words = set(WORD.findall(text)) - allowed.get(rel, set())
            if words:
                found[rel] = words
    return found


def test_the_tree_spells_vectorise_one_way():
    assert old_spellings(ROOT, ALLOWED, skip=("tests/test_old_spellings.py",)) == {}


def test_the_spelling_scan_sees_a_planted_old_spelling(tmp_path):
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "x.py").write_text("def f(vectorize_seeds):\n    return 'Vectorized'\n")
    (tmp_path / "harness" / "trial.py").write_text("OLD = {'vectorized': 'vectorised', 'vectorizes': 1}\n")
    (tmp_path / "README.md").write_text("run --vectorize-seeds on\n")
    assert old_spellings(tmp_path, ALLOWED) == {"harness/x.py": {"vectorize_seeds", "Vectorized"},
                                                "harness/trial.py": {"vectorizes"},
                                                "README.md": {"--vectorize-seeds"}}
