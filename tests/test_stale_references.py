"""tools/stale_references.py on a temporary git repository: a reference is stale exactly when a file
that can move its numbers changed after its recorded commit, and ``unknown`` (never an error) where the
history does not hold that commit (a shallow clone)."""
from __future__ import annotations

import importlib.util
import json
import subprocess

import sys

import pytest

from .conftest import ROOT

_spec = importlib.util.spec_from_file_location("stale_references", ROOT / "tools" / "stale_references.py")
stale = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = stale  # dataclasses look their module up there
_spec.loader.exec_module(stale)


def _git(repo, *args) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(repo), "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def _commit(repo, files: dict[str, str], message: str) -> str:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "--short", "HEAD")


def _reference(repo, name: str, commit: str | None) -> None:
    env = {} if commit is None else {"git_commit": commit}
    path = repo / "results" / "reference" / name / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"environment": env}))


@pytest.fixture
def repo(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    first = _commit(repo, {"harness/train.py": "a\n", "harness/cli.py": "a\n", "docs/x.md": "a\n"}, "one")
    _reference(repo, "trained", first)
    _reference(repo, "dirty/inner", first + "+uncommitted")
    _reference(repo, "nowhere", "0123abc")   # a commit this history does not hold
    _reference(repo, "no-commit", None)      # skipped
    _reference(repo, "check-record", first)  # a check record: the checks' changes count too
    (repo / "results" / "reference" / "check-record" / "checks.md").write_text("classes\n")
    second = _commit(repo, {"harness/cli.py": "b\n", "docs/x.md": "b\n", "harness/checks/probes.py": "b\n"},
                     "cli, docs and the checks")
    _reference(repo, "after-cli", second)
    _commit(repo, {"harness/train.py": "b\n"}, "the training loop")
    return repo, first, second


def test_a_reference_is_stale_only_when_a_file_that_moves_numbers_changed(repo):
    repo, first, second = repo
    refs = stale.find_references(repo / "results" / "reference")
    assert [(r.name, r.commit, r.uncommitted) for r in refs] == [
        ("after-cli", second, False), ("check-record", first, False), ("dirty", first, True),
        ("nowhere", "0123abc", False), ("trained", first, False)]
    states = {r.reference.name: r for r in (stale.staleness(repo, ref) for ref in refs)}
    assert states["trained"].state == "stale" and states["trained"].changed == ["harness/train.py"]
    assert states["dirty"].changed == ["harness/train.py"]  # docs, cli.py and checks/ changed too, not listed
    assert states["check-record"].changed == ["harness/checks/probes.py", "harness/train.py"]
    assert states["nowhere"].state == "unknown" and "0123abc" in states["nowhere"].reason
    # at the commit before the training-loop change, the cli/docs change alone leaves it current
    at_second = stale.staleness(repo, refs[4], head=second)
    assert at_second.state == "current" and at_second.changed == []


def test_the_command_line_and_a_shallow_clone(repo, tmp_path, capsys):
    repo, first, second = repo
    assert stale.main(["--root", str(repo), "--files"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert any(ln.startswith("trained") and first in ln and "stale: 1 file" in ln for ln in out)
    assert any(ln.strip() == "harness/train.py" for ln in out)
    assert stale.main(["--root", str(repo), "--strict"]) == 1
    shallow = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow)], check=True)
    assert stale.main(["--root", str(shallow), "--strict"]) == 0  # nothing known to be stale
    out = capsys.readouterr().out
    assert f"unknown: commit {first} not in this clone's history" in out
    assert stale.main(["--root", str(tmp_path / "missing")]) == 2
    assert "no results/reference folder" in capsys.readouterr().err
