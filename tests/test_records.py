"""Check records live apart from the runs, and ``latest`` means the latest *finished* run.

``check`` writes ``<results-dir>/checks/<run-id>/``; ``report latest``, ``harness.load_run("latest")``
and ``resolve_run("latest")`` pass over check records, benches, profiles and runs that are
running or were interrupted; ``report``/``compare`` refuse a record with one line, ``verify`` reads it.
Runs are copies of a committed reference run (no training here), with their status edited.
"""
from __future__ import annotations

import json
import os
import shutil
from types import SimpleNamespace

import pytest

import harness
import harness.cli
import harness.commands.check as check_cmd
from harness.lookup import latest_run, resolve_run
from harness.errors import StoreError

from .conftest import ROOT

REFERENCE = ROOT / "results" / "reference" / "task-sort"  # a finished 2-trial training run


def _run(results, name: str, status: str | None, mtime: float) -> None:
    """A copy of the reference run named ``name`` with ``status`` (None: no status key, as runs
    stored before it was recorded) and its config.json written at ``mtime``."""
    shutil.copytree(REFERENCE, results / name)
    cfg = results / name / "config.json"
    meta = json.loads(cfg.read_text())
    meta.pop("status", None)
    if status is not None:
        meta["status"] = status
    meta["run_id"] = name
    cfg.write_text(json.dumps(meta))
    os.utime(cfg, (mtime, mtime))


def _record(folder, kind: str, mtime: float) -> None:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"kind": kind, "command": "python -m harness " + kind}))
    (folder / f"{kind}s.md").write_text("# record\n")
    os.utime(folder / "config.json", (mtime, mtime))


@pytest.fixture
def fast_check(monkeypatch):
    """``check`` with the numerical work stubbed out: these tests are about where its record goes."""
    report = SimpleNamespace(ok=True, tf32=None, wall_s=0.0)
    monkeypatch.setattr("harness.checks.run_checks", lambda *a, **k: report)  # what checking.start_check runs
    monkeypatch.setattr("harness.checks.results_frame", lambda rep: __import__("pandas").DataFrame({"section": []}))
    monkeypatch.setattr("harness.checks.render_markdown", lambda rep, meta: "# checks\n")
    monkeypatch.setattr(check_cmd, "render_text", lambda rep, *layout: "checked")


def test_the_python_api_check_writes_the_record_the_command_writes(tmp_path, fast_check):
    """``harness.check`` and ``python -m harness check`` both go through ``checking.start_check``:
    the same record (config.json, checks.csv, checks.md) under ``<results-dir>/checks/``."""
    results = tmp_path / "results"
    outcome = harness.check(variants="baseline", preset="tiny", device="cpu", results_dir=results, run_id="api")
    assert outcome.ok and outcome.exit_code == 0 and outcome.store.root == results / "checks" / "api"
    assert harness.cli.main(["check", "--variants", "baseline", "--preset", "tiny", "--device", "cpu", "-q",
                             "--results-dir", str(results), "--run-id", "cli"]) == 0
    folders = {name: results / "checks" / name for name in ("api", "cli")}
    for folder in folders.values():
        assert sorted(p.name for p in folder.iterdir()) == ["checks.csv", "checks.md", "config.json", "trials"]
    metas = {n: json.loads((f / "config.json").read_text()) for n, f in folders.items()}
    assert metas["api"]["command"].startswith("python -m harness check --variants baseline --preset tiny")
    same = {"run_id", "command", "created", "environment"}
    assert {k: v for k, v in metas["api"].items() if k not in same} == \
        {k: v for k, v in metas["cli"].items() if k not in same}
    with pytest.raises(harness.HarnessError, match="run id"):  # refused before any check runs
        harness.check(variants="baseline", results_dir=results, run_id="../x")


def test_a_dozen_checks_leave_results_showing_runs_only(tmp_path, fast_check, capsys):
    results = tmp_path / "results"
    _run(results, "my-run", "complete", 1_000_000)
    for _ in range(12):  # in one or two seconds: the default ids must not collide
        assert harness.cli.main(["check", "--variants", "baseline", "--preset", "tiny", "-q",
                                 "--results-dir", str(results)]) == 0
    assert sorted(p.name for p in results.iterdir()) == ["checks", "my-run"]
    records = sorted((results / "checks").iterdir())
    assert len(records) == 12 and all(p.name.startswith("check-") for p in records)
    for p in records:
        meta = json.loads((p / "config.json").read_text())
        assert meta["kind"] == "check" and meta["run_id"] == p.name and (p / "checks.md").is_file()
    assert latest_run(str(results)).root.name == "my-run"
    assert harness.cli.main(["report", "latest", "--results-dir", str(results), "-q"]) == 0
    assert str(results / "my-run" / "report.md") in capsys.readouterr().out


def test_an_explicit_check_run_id_goes_under_checks_and_is_not_reused(tmp_path, fast_check, capsys):
    results = tmp_path / "results"
    argv = ["check", "--variants", "baseline", "-q", "--results-dir", str(results), "--run-id", "c1"]
    assert harness.cli.main(argv) == 0
    assert (results / "checks" / "c1" / "checks.md").is_file()
    assert harness.cli.main(argv) == 2
    assert "run id 'c1' already exists" in capsys.readouterr().err


def test_check_refuses_a_run_named_checks(tmp_path, fast_check, capsys):
    results = tmp_path / "results"
    _run(results, "checks", "complete", 1_000_000)
    assert harness.cli.main(["check", "--variants", "baseline", "-q", "--results-dir", str(results)]) == 2
    assert "is a run folder, but check records go there" in capsys.readouterr().err
    assert sorted(p.name for p in (results / "checks").iterdir()) == sorted(p.name for p in REFERENCE.iterdir())


def test_latest_is_the_latest_finished_run(tmp_path):
    """Newer than the finished run: an interrupted run, a running (or killed) one, a bench, a check
    record and a legacy run without report; ``latest`` names the finished one."""
    results = tmp_path / "results"
    _run(results, "a-finished", "complete", 1_000_000)
    _run(results, "b-older-finished", "complete", 900_000)
    _run(results, "zz-interrupted", "interrupted", 1_000_100)
    _run(results, "zz-running", "running", 1_000_200)
    _run(results, "zz-legacy-no-report", None, 1_000_300)
    (results / "zz-legacy-no-report" / "report.md").unlink()
    _record(results / "bench-1", "bench", 1_000_400)
    _record(results / "checks" / "check-1", "check", 1_000_500)
    (results / "empty-folder").mkdir()
    assert latest_run(str(results)).root.name == "a-finished"
    assert resolve_run("latest", str(results)).root.name == "a-finished"
    loaded = harness.load_run("latest", results_dir=results)
    assert loaded.path == (results / "a-finished").resolve() and len(loaded.trials) == 2
    # a run stored before the status existed counts once its report and every planned trial are there
    _run(results, "zz-legacy-finished", None, 1_000_600)
    assert latest_run(str(results)).root.name == "zz-legacy-finished"
    # an interrupted run finished by --resume becomes complete and, written last, the latest
    cfg = results / "zz-interrupted" / "config.json"
    cfg.write_text(cfg.read_text().replace('"interrupted"', '"complete"'))
    os.utime(cfg, (1_000_700, 1_000_700))
    assert latest_run(str(results)).root.name == "zz-interrupted"


def test_no_finished_run_names_the_newest_folder_and_why(tmp_path):
    results = tmp_path / "results"
    _run(results, "r1", "interrupted", 1_000_000)
    _record(results / "checks" / "check-1", "check", 1_000_100)
    with pytest.raises(StoreError, match=r"no finished run under .*/r1' \(status 'interrupted'\).*run --resume .*/r1\)$"):
        latest_run(str(results))
    (results / "r1" / "config.json").unlink()
    with pytest.raises(StoreError, match="no runs under"):
        latest_run(str(results))


def test_report_compare_and_verify_handed_a_check_record(tmp_path, fast_check, capsys):
    results = tmp_path / "results"
    _run(results, "run", "complete", 1_000_000)
    assert harness.cli.main(["check", "--variants", "baseline", "-q", "--results-dir", str(results),
                             "--run-id", "c"]) == 0
    record = results / "checks" / "c"
    capsys.readouterr()
    for argv in (["report", str(record)], ["report", "c", "--results-dir", str(results)],
                 ["compare", "run", str(record), "--results-dir", str(results)]):
        assert harness.cli.main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "is a check record, not a training run: read checks.md there" in err[0], argv
    assert not (record / "report.md").exists()  # report wrote nothing into the record
    with pytest.raises(StoreError, match="is a check record"):
        harness.load_run(record)
    assert harness.cli.main(["verify", str(record)]) == 0
    out = capsys.readouterr().out
    assert "planned-trials check is skipped" in out and f"verify {record}: ok" in out


def test_verify_reads_a_gzipped_curves_table_and_catches_a_changed_one(tmp_path):
    """Committed references keep big curves tables as curves.csv.gz: verify reads them in place of
    curves.csv and still finds a table that does not match the trial files."""
    import gzip
    import shutil

    from harness.store import RunStore
    from harness.verification import verify_run

    run = tmp_path / "run"
    shutil.copytree(REFERENCE, run)
    text = (run / "curves.csv").read_bytes()
    (run / "curves.csv").unlink()
    (run / "curves.csv.gz").write_bytes(gzip.compress(text))
    assert verify_run(RunStore(run))[0] == []  # no problem (its notes: trial files older than checksums)
    (run / "curves.csv.gz").write_bytes(gzip.compress(text.replace(b"\nbaseline,0,,1,", b"\nbaseline,0,,7,", 1)))
    problems, _ = verify_run(RunStore(run))
    assert len(problems) == 1 and problems[0].startswith("curves.csv.gz: does not match the trial files")
    (run / "curves.csv.gz").write_bytes(b"not gzip")
    assert verify_run(RunStore(run))[0][0].startswith("curves.csv.gz: cannot be read")
    (run / "curves.csv.gz").unlink()  # left out (the committed references do): a note, the trial files hold it
    problems, notes = verify_run(RunStore(run))
    assert problems == [] and any(n.startswith("curves.csv: absent; the trial files hold every curve") for n in notes)
    (run / "trials.csv").unlink()  # the summary table is still required
    assert verify_run(RunStore(run))[0][0].startswith("trials.csv: missing")


def test_a_gzipped_trial_file_is_read_verified_resumed_and_retired_like_a_plain_one(tmp_path):
    """``trials/<key>.json.gz`` (committed references gzip long curves) is the same trial: verify
    passes, load_run and resume see it, --retry-failed retires it; a truncated or edited one is caught."""
    import gzip

    from harness.store import RunStore
    from harness.verification import verify_run

    source = ROOT / "results" / "reference" / "main-job"  # trial files with checksums
    run = tmp_path / "run"
    shutil.copytree(source, run)
    plain = sorted((run / "trials").glob("*.json"))[0]
    key = plain.stem
    packed = plain.with_name(plain.name + ".gz")
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    plain.unlink()
    store = RunStore.open(run)
    assert verify_run(store)[0] == []
    assert key in {r.key for r in store.load_trials()} and store.missing([key]) == []
    assert store.trial_path(key) == packed

    edited = json.loads(gzip.decompress(packed.read_bytes()))
    edited["row"]["heldout_ce"] = 0.0
    packed.write_bytes(gzip.compress(json.dumps(edited).encode()))
    assert any("checksum mismatch" in p for p in verify_run(RunStore.open(run))[0])
    packed.write_bytes(gzip.compress(plain.with_suffix("").name.encode())[:20])  # truncated
    assert any("truncated" in p or "cannot be read" in p for p in verify_run(RunStore.open(run))[0])

    packed.write_bytes(gzip.compress((source / "trials" / plain.name).read_bytes()))
    store = RunStore.open(run)
    moved = store.retire(key)
    assert moved.name == packed.name and moved.parent.name == "retried" and store.missing([key]) == [key]


def test_a_gzipped_config_reads_like_the_plain_one_and_a_rewrite_leaves_one_config(tmp_path):
    """A reference thinned for size stores ``config.json.gz`` (results/reference/README.md): opening,
    ``load_run``, ``latest``, ``verify`` and ``tools/stale_references.py`` read it as the plain file; a
    rewrite of the metadata leaves a plain ``config.json`` alone; a truncated one is one StoreError."""
    import gzip
    import subprocess
    import sys

    from harness.store import RunStore
    from harness.verification import verify_run

    results = tmp_path / "results" / "reference"
    run = results / "sort"
    shutil.copytree(REFERENCE, run)
    plain = json.loads((run / "config.json").read_text())
    (run / "config.json.gz").write_bytes(gzip.compress((run / "config.json").read_bytes()))
    (run / "config.json").unlink()

    assert harness.load_run(run).meta.to_dict() == RunStore.open(REFERENCE).meta().to_dict()
    assert latest_run(results).root == run and resolve_run("sort", results).root == run
    assert verify_run(RunStore.open(run))[0] == []
    tool = subprocess.run([sys.executable, str(ROOT / "tools" / "stale_references.py"), "--root", str(tmp_path)],
                          capture_output=True, text=True)
    assert plain["environment"]["git_commit"][:7] in tool.stdout, tool.stdout + tool.stderr

    store = RunStore.open(run)
    store.write_meta(store.meta())
    assert sorted(p.name for p in run.glob("config.json*")) == ["config.json"]
    assert json.loads((run / "config.json").read_text())["config_hash"] == plain["config_hash"]

    (run / "config.json.gz").write_bytes(gzip.compress((run / "config.json").read_bytes())[:30])
    (run / "config.json").unlink()
    with pytest.raises(StoreError, match="cannot read"):
        RunStore.open(run).meta()
