"""Nothing stored is lost silently: corrupt and foreign trial files, checksums, ``verify``.

One real tiny run (2 variants x 1 seed, one thread) is made once for the module; every test
damages its own copy of it.

* A truncated trial file and a foreign one (valid JSON without ``row``) are moved to
  ``trials/quarantine/`` with one warning line each; ``run --resume`` runs those trials again
  (bitwise the same metrics: same seed and threads); the report names the files.
* A file changed after it was written fails its checksum; ``report`` quarantines it.
* ``verify`` names every problem of a damaged copy on its own line and exits 1, changes
  nothing, exits 0 on an intact run (and on an interrupted one), and 2 on a path that is no run.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness import cli
from harness.errors import HarnessWarning
from harness.store import RunStore
from harness.trial import CorruptTrialError, read_trial_file, trial_checksum

# its module-scoped fixture is built once: under ``pytest -n 2 --dist loadgroup`` the module stays on one worker
pytestmark = pytest.mark.xdist_group("integrity")

TIMING = {"wall_s", "train_s", "step_ms", "tokens_per_s", "time_to_solve_s", "peak_mem_mb", "overhead_share"}
KEYS = ["baseline__s0", "pre_norm__s0"]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("integrity")
    argv = ["run", "--variants", "baseline,pre_norm", "--preset", "tiny", "--device", "cpu", "--jobs", "1",
            "--threads", "1", "--results-dir", str(root), "--run-id", "r", "-q"]
    assert cli.main(argv) == 0
    return root / "r"


@pytest.fixture
def run(pristine, tmp_path):
    dst = tmp_path / "results" / "r"
    shutil.copytree(pristine, dst)
    return dst


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _metrics(path: Path) -> dict:
    row = json.loads(path.read_text())["row"]
    return {k: v for k, v in row.items() if k not in TIMING}


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("harness: warning: ")]


def test_trial_files_carry_a_checksum_of_their_content(run):
    for key in KEYS:
        data = json.loads((run / "trials" / f"{key}.json").read_text())
        assert data["checksum"].startswith("sha256:") and data["checksum"] == trial_checksum(data)
        assert read_trial_file(run / "trials" / f"{key}.json")["row"]["status"] == "ok"
    assert json.loads((run / "config.json").read_text())["status"] == "complete"


@pytest.mark.parametrize("damage", ["truncated", "empty", "foreign", "json_list", "not_utf8"])
def test_damaged_trial_is_quarantined_and_resume_runs_it_again(run, capsys, damage):
    path = run / "trials" / "baseline__s0.json"
    before = _metrics(path)
    text = path.read_text()
    path.write_bytes({"truncated": text[: len(text) // 2].encode(), "empty": b"",
                      "foreign": json.dumps({"hello": "world", "rows": []}).encode(),
                      "json_list": b"[1, 2, 3]", "not_utf8": b"\xff\xfe{\x00"}[damage])
    damaged = path.read_bytes()
    capsys.readouterr()
    assert cli.main(["run", "--resume", str(run), "-q"]) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    warnings = _warnings(err)
    assert len(warnings) == 1, err
    assert "baseline__s0.json" in warnings[0] and "moved to" in warnings[0] and "quarantine" in warnings[0]
    # moved aside byte for byte, with its reason; the trial was run again, bitwise the same
    assert (run / "trials" / "quarantine" / "baseline__s0.json").read_bytes() == damaged
    reason = json.loads((run / "trials" / "quarantine" / "baseline__s0.json.reason").read_text())
    assert reason["file"] == "baseline__s0.json" and reason["reason"]
    assert _metrics(path) == before
    report = (run / "report.md").read_text()
    assert "## Unreadable trial files" in report and "trials/quarantine/baseline__s0.json" in report
    assert "pre_norm" in out and "baseline" in out  # both in the printed table
    # the run is whole again
    assert cli.main(["verify", str(run), "-q"]) == 0


def test_trial_file_changed_after_writing_fails_its_checksum(run, capsys):
    path = run / "trials" / "pre_norm__s0.json"
    data = json.loads(path.read_text())
    data["row"]["exact_match"] = 1.0  # valid JSON, right schema, wrong content
    path.write_text(json.dumps(data))
    with pytest.raises(CorruptTrialError, match="checksum mismatch"):
        read_trial_file(path)
    capsys.readouterr()
    assert cli.main(["report", str(run), "-q"]) == 0
    err = capsys.readouterr().err
    assert len(_warnings(err)) == 1 and "checksum mismatch" in err
    assert not path.exists() and (run / "trials" / "quarantine" / "pre_norm__s0.json").is_file()
    assert "pre_norm" not in (run / "trials.csv").read_text()  # never shown as if it were a result


def test_library_callers_get_a_harness_warning(run):
    (run / "trials" / "baseline__s0.json").write_text("{")
    with pytest.warns(HarnessWarning, match="not valid JSON"):
        keys = RunStore.open(run).done_keys()
    assert keys == {"pre_norm__s0"}


def test_legacy_trial_without_checksum_is_checked_by_schema(run):
    path = run / "trials" / "baseline__s0.json"
    data = json.loads(path.read_text())
    del data["checksum"]
    path.write_text(json.dumps(data))
    assert read_trial_file(path)["row"]["variant"] == "baseline"
    copy = run / "trials" / "baseline__s1.json"  # a valid trial under another trial's name
    copy.write_text(json.dumps(data))
    with pytest.raises(CorruptTrialError, match="holds trial 'baseline__s0'"):
        read_trial_file(copy)


def test_verify_intact_run(run, capsys):
    capsys.readouterr()
    assert cli.main(["verify", str(run)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [f"verify {run}: ok (2 trial file(s))"]


def test_verify_names_every_problem_of_a_damaged_copy_and_changes_nothing(run, capsys):
    trials = run / "trials"
    (trials / "baseline__s0.json").write_text((trials / "baseline__s0.json").read_text()[:50])  # truncated
    data = json.loads((trials / "pre_norm__s0.json").read_text())
    data["row"]["heldout_ce"] = 0.0
    (trials / "pre_norm__s0.json").write_text(json.dumps(data))  # tampered
    (trials / "stray__s0.json").write_text(json.dumps({"hello": 1}))  # foreign
    row = dict(data["row"], variant="unplanned")
    extra = {"row": row, "curve": []}
    (trials / "unplanned__s0.json").write_text(json.dumps({**extra, "checksum": trial_checksum(extra)}))
    with (run / "trials.csv").open("a") as f:
        f.write("edited,by,hand\n")
    before = _snapshot(run)
    capsys.readouterr()
    assert cli.main(["verify", str(run), "-q"]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert _snapshot(run) == before  # read-only
    expected = {
        "trials/baseline__s0.json": "is not valid JSON",
        "trials/pre_norm__s0.json": "checksum mismatch",
        "trials/stray__s0.json": "has no 'row' object",
        "trials/unplanned__s0.json": "not a trial planned in config.json",
        "trials.csv": "does not match the trial files",
        "curves.csv": "does not match the trial files",
    }
    assert len(lines) == len(expected), lines
    for rel, what in expected.items():
        assert any(line.startswith(f"{run}/{rel}: ") and what in line for line in lines), (rel, lines)


def test_verify_missing_trial_of_a_finished_run_is_a_problem_but_not_of_an_interrupted_one(run, capsys):
    (run / "trials" / "pre_norm__s0.json").unlink()
    RunStore.open(run).write_tables()  # tables as the run would have rendered them
    capsys.readouterr()
    assert cli.main(["verify", str(run), "-q"]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and "trials/pre_norm__s0.json: missing" in lines[0] and "--resume" in lines[0]
    meta = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**meta, "status": "interrupted"}))
    assert cli.main(["verify", str(run)]) == 0
    out = capsys.readouterr().out
    assert "the run was interrupted: 1 of 2 planned trial(s) stored" in out and f"--resume {run}" in out


def test_verify_unreadable_config_is_a_problem(run, capsys):
    (run / "config.json").write_text("{ not json")
    capsys.readouterr()
    assert cli.main(["verify", str(run), "-q"]) == 1
    assert capsys.readouterr().out.strip().splitlines() == [
        f"{run}/config.json: cannot be read as JSON (Expecting property name enclosed in double quotes: "
        f"line 1 column 3 (char 2))"]


def test_verify_bad_input_is_exit_2(tmp_path, capsys):
    assert cli.main(["verify", str(tmp_path / "no_such_run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("harness: error: run ") and "not found" in err[0]
    missing = tmp_path / "no_such_run"  # absolute: one place looked at, named once
    assert f"not found: '{missing}' is not a run folder" in err[0] and "neither" not in err[0]
    assert cli.main(["verify", "no_such_run", "--results-dir", str(tmp_path)]) == 2
    assert f"neither 'no_such_run' nor '{missing}' is a run folder" in capsys.readouterr().err


def test_environment_deterministic_line_matches_the_trial_settings_line(run):
    """A run's block said 'deterministic: True' while check's said False next to 'trial_settings:
    deterministic_algorithms: on': both lines now describe the same thing."""
    from harness.env import environment

    env = json.loads((run / "config.json").read_text())["environment"]
    assert env["deterministic"] is True and "deterministic_algorithms: on" in env["trial_settings"]
    off = environment("cpu", trial_settings_applied=False)
    assert off["deterministic"] is False and off["trial_settings"].startswith("not applied")
    on = environment("cpu", trial_settings_applied=True)
    assert on["deterministic"] is True and "deterministic_algorithms: on" in on["trial_settings"]
