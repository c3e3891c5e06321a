"""The code that made a run is recorded, and ``--resume`` enforces it (harness/provenance.py).

* A plugin file edited between a run and its ``--resume``: exit 2, one line naming the file, nothing
  run or rewritten; ``--allow-code-change`` goes on and records it (config.json, log.txt,
  report.md, a second copy of the source); ``load_model`` then warns for the trial the old code
  trained and not for the one the new code trained; a later plain resume compares with the new code.
* The project's own code changed (its source hash and commit, simulated): exit 2 naming the commits.
* A run made before the record existed resumes (a note) and verifies (a note); a tampered
  plugin copy is a verify problem.
"""
from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest

import harness.provenance as provenance
from harness.errors import ConfigError, HarnessWarning
from harness.provenance import code_changes, source_sha256
from harness.request import RunRequest
from harness.saved import load_model
from harness.store import RunStore
from harness.verification import verify_run

from .conftest import cli_in_process

ROOT = Path(__file__).resolve().parents[1]

PLUGIN = '''
"""A post-norm whose residual branch is scaled by ALPHA (1: the baseline's function)."""
from torch import nn

from harness import Component, Variant, hookimpl

ALPHA = 1.0


class ScaledPostNorm(nn.Module):
    final_norm = False

    def __init__(self, ctx):
        super().__init__()
        self.norm = ctx.layer_norm()

    def forward(self, x, sublayer):
        return self.norm(x + ALPHA * sublayer(x))


@hookimpl
def harness_add_components():
    return [Component("scaled_post", "norm", ScaledPostNorm, "post-norm, residual branch scaled by ALPHA")]


@hookimpl
def harness_add_variants():
    return [Variant("scaled", {"norm": "scaled_post"}, summary="residual branch scaled by ALPHA")]
'''

TINY = ["--preset", "tiny", "--seeds", "2", "--set", "train.steps=3", "--set", "train.eval_sequences=16",
        "--device", "cpu", "--jobs", "1", "--no-check", "-q", "--save-models"]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """One stored run of the plugin's variant (2 seeds, weights kept) and the plugin file."""
    base = tmp_path_factory.mktemp("prov")
    plugin = base / "scaled_plugin.py"
    plugin.write_text(PLUGIN)
    r = cli_in_process("--plugin", plugin, "run", "--variants", "scaled", *TINY, "--results-dir", base, "--run-id", "r")
    assert r.returncode == 0, r.stderr
    return base / "r", plugin


@pytest.fixture
def run(made, tmp_path):
    """A copy of the stored run whose seed 1 is missing (as after a kill), with its plugin at its own
    path (the run records the plugin's absolute path, so the copy's config.json is pointed at it)."""
    src, plugin = made
    dst, copy = tmp_path / "r", tmp_path / "scaled_plugin.py"
    shutil.copytree(src, dst)
    shutil.copy(plugin, copy)
    text = (dst / "config.json").read_text().replace(json.dumps(str(plugin.resolve()))[1:-1],
                                                    json.dumps(str(copy.resolve()))[1:-1])
    (dst / "config.json").write_text(text)
    (dst / "trials" / "scaled__s1.json").unlink()
    return dst, copy


def test_a_run_records_its_code_and_a_copy_of_each_plugin(made):
    root, plugin = made
    code = json.loads((root / "config.json").read_text())["code"]
    assert code["source_sha256"] == source_sha256() and len(code["source_sha256"]) == 64
    assert set(code) >= {"commit", "dirty", "diff_sha256", "plugins"}
    [p] = code["plugins"]
    assert p["path"] == str(plugin.resolve()) and p["sha256"] == provenance.sha256(plugin.read_bytes())
    assert (root / p["copy"]).read_bytes() == plugin.read_bytes()
    assert "- code: commit" in (root / "report.md").read_text()


def test_an_edited_plugin_refuses_the_resume_unless_allowed_and_load_model_warns(run):
    root, plugin = run
    before = (root / "config.json").read_bytes()
    plugin.write_text(PLUGIN.replace("ALPHA = 1.0", "ALPHA = 1.00"))  # same function, other code
    r = cli_in_process("run", "--resume", root)
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"plugin file {plugin.resolve()} changed" in r.stderr and "--allow-code-change" in r.stderr
    assert (root / "config.json").read_bytes() == before and not (root / "trials" / "scaled__s1.json").exists()

    r = cli_in_process("run", "--resume", root, "--allow-code-change", "-q")
    assert r.returncode == 0, r.stderr
    meta = json.loads((root / "config.json").read_text())
    entry = meta["resumes"][-1]
    assert entry["kept"] == ["scaled__s0"] and "--allow-code-change" in entry["command"]
    assert entry["code_changes"] == [line for line in entry["code_changes"] if str(plugin.resolve()) in line] != []
    assert entry["code"]["plugins"][0]["sha256"] == provenance.sha256(plugin.read_bytes())
    assert len(list((root / "plugins").iterdir())) == 2  # the old source and the new one
    assert "going on (--allow-code-change)" in (root / "log.txt").read_text()
    assert "code changed at resume 1 (--allow-code-change" in (root / "report.md").read_text()

    with pytest.warns(HarnessWarning, match="scaled__s0 .* trained by other code .*scaled_plugin.py changed"):
        load_model(root, "scaled", 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HarnessWarning)
        load_model(root, "scaled", 1)  # trained by this code: no warning

    (root / "trials" / "scaled__s1.json").unlink()
    again = cli_in_process("run", "--resume", root, "-q")  # compared with the latest code: the same
    assert again.returncode == 0, again.stderr
    problems, notes = verify_run(RunStore(root))
    assert problems == [] and any("trained by 2 versions of the code" in n for n in notes), (problems, notes)


def test_a_change_of_the_projects_code_refuses_the_resume(run, monkeypatch):
    root, _ = run
    stored = json.loads((root / "config.json").read_text())["code"]
    monkeypatch.setattr(provenance, "source_sha256", lambda root=None: "f" * 64)
    monkeypatch.setattr(provenance, "git_state", lambda root=None: {"commit": "abcdef0123456789", "dirty": False,
                                                                      "diff_sha256": None})
    r = cli_in_process("run", "--resume", root)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    if stored["commit"]:  # a git checkout: the commits name the change
        assert f"the project's code: commit {stored['commit'][:10]} -> abcdef0123" in r.stderr, r.stderr
    else:  # no git where the run was made: the source hash alone
        assert "the project's code: its source differs" in r.stderr, r.stderr


def test_code_changes_names_how_the_project_changed_and_ignores_a_commit_that_changed_no_code():
    base = {"commit": "a" * 40, "dirty": False, "diff_sha256": None, "source_sha256": "1" * 64, "plugins": []}
    assert code_changes(base, {**base, "commit": "b" * 40}) == []  # e.g. a commit of docs only
    assert code_changes(base, {**base, "commit": "b" * 40, "source_sha256": "2" * 64}) == [
        "the project's code: commit aaaaaaaaaa -> bbbbbbbbbb"]
    dirty = {**base, "dirty": True, "diff_sha256": "d" * 64, "source_sha256": "2" * 64}
    assert code_changes(base, dirty) == ["the project's code: uncommitted changes under harness/ or variants/ "
                                         "differ (diff sha256 none -> dddddddddddd)"]
    assert "files git does not track" in code_changes(base, {**base, "source_sha256": "2" * 64})[0]
    p = {"name": "x", "path": "/p/x.py", "sha256": "3" * 64, "copy": "plugins/x-333333333333.py"}
    assert code_changes({**base, "plugins": [p]}, base) == ["plugin file /p/x.py is no longer loaded"]
    assert code_changes(base, {**base, "plugins": [p]}) == ["plugin file /p/x.py is loaded now but was not then"]


def test_the_source_hash_covers_every_py_file_of_the_code_and_nothing_else(tmp_path):
    for folder in provenance.CODE_DIRS:
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    first = source_sha256(tmp_path)
    assert first == source_sha256(ROOT)  # the hash does not depend on where the checkout is
    (tmp_path / "harness" / "__pycache__").mkdir(exist_ok=True)
    (tmp_path / "harness" / "__pycache__" / "stale.py").write_text("x = 1\n")
    (tmp_path / "harness" / "notes.txt").write_text("not code\n")
    assert source_sha256(tmp_path) == first
    (tmp_path / "variants" / "new_plugin.py").write_text("")  # an untracked module counts (git would miss it)
    assert source_sha256(tmp_path) != first
    (tmp_path / "variants" / "new_plugin.py").unlink()
    config = tmp_path / "harness" / "config.py"
    config.write_bytes(config.read_bytes() + b"\n")
    assert source_sha256(tmp_path) != first


def test_a_run_without_a_code_record_resumes_and_verifies_with_a_note(run):
    root, _ = run
    meta = json.loads((root / "config.json").read_text())
    del meta["code"]
    (root / "config.json").write_text(json.dumps(meta, indent=2))
    r = cli_in_process("run", "--resume", root, "-q")
    assert r.returncode == 0, r.stderr
    assert "recorded no code" in (root / "log.txt").read_text()
    entry = json.loads((root / "config.json").read_text())["resumes"][-1]
    assert entry["code"]["source_sha256"] == source_sha256() and entry["kept"] == ["scaled__s0"]
    problems, notes = verify_run(RunStore(root))
    assert problems == [] and not any("records no code" in n for n in notes)  # the resume recorded it
    with warnings.catch_warnings():
        warnings.simplefilter("error", HarnessWarning)
        load_model(root, "scaled", 0)  # trained by unknown code: nothing to compare, no warning


def test_verify_notes_an_older_reference_run_and_flags_a_tampered_plugin_copy(run):
    problems, notes = verify_run(RunStore(ROOT / "results" / "reference" / "task-sort"))
    assert problems == [] and any("records no code" in n for n in notes)
    root, plugin = run
    [copy] = (root / "plugins").iterdir()
    copy.write_text("print('not the plugin')\n")
    problems, _ = verify_run(RunStore(root))  # (its tables also name the trial the fixture removed)
    assert [p for p in problems if p.startswith("plugins/")] == [
        f"plugins/{copy.name}: checksum mismatch (not the plugin source config.json records)"], problems
    copy.unlink()
    assert f"plugins/{copy.name}: missing or unreadable" in " ".join(verify_run(RunStore(root))[0])


def test_allow_code_change_needs_resume():
    with pytest.raises(ConfigError, match="--allow-code-change needs --resume"):
        RunRequest(allow_code_change=True).validate()
    r = cli_in_process("run", "--allow-code-change", "--preset", "tiny")
    assert r.returncode == 2 and "--allow-code-change needs --resume" in r.stderr


def test_an_edited_plugin_file_is_loaded_again_in_the_same_process(tmp_path):
    from harness.trial import registry_for

    path = tmp_path / "p.py"
    path.write_text(PLUGIN)
    plugins = {"modules": [], "files": [str(path)], "strict": False}
    first = registry_for(plugins)
    assert registry_for(plugins) is first
    path.write_text(PLUGIN.replace('"scaled"', '"scaled_more"') + "\n")
    again = registry_for(plugins)
    assert again is not first and "scaled_more" in again.variants and "scaled" not in again.variants
