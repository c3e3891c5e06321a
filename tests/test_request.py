"""A run is one typed request (harness.request.RunRequest) that the command line, the Python API
and the suite all build, started by harness.launch: the command line's request equals the API's,
nothing below harness/commands/ sees argv, interrupts at any phase end as `interrupted` with the
resume hint, and `--resume --retry-failed` runs failed trials again, keeping their old files."""
from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

from harness import cli, launch
from harness.commands.run import request_from_args
from harness.plugins import PluginSpec
from harness.request import RunRequest, Terminated

ROOT = Path(__file__).resolve().parents[1]

#: A component that raises while HARNESS_TEST_BREAK is set: the cause a user fixes before retrying.
FLAKY_PLUGIN = '''
import os

from torch import nn

from harness import Component, Variant, hookimpl


class SometimesBroken(nn.Module):
    """Post-norm residual that raises while HARNESS_TEST_BREAK=1 (a bug the user then fixes)."""

    final_norm = False

    def __init__(self, ctx):
        super().__init__()
        self.norm = ctx.layer_norm()

    def forward(self, x, sublayer):
        if os.environ.get("HARNESS_TEST_BREAK") == "1":
            raise RuntimeError("broken on purpose")
        return self.norm(x + sublayer(x))


@hookimpl
def harness_add_components():
    return [Component("sometimes", "norm", SometimesBroken, "raises while HARNESS_TEST_BREAK=1",
                      equivalent_to="post")]


@hookimpl
def harness_add_variants():
    return [Variant("flaky", {"norm": "sometimes"})]
'''


def _parse(*argv: str):
    return cli.parse_args(list(argv))


def test_the_command_line_and_the_api_build_the_same_request():
    args = _parse("run", "--variants", "baseline", "pre_*", "--seeds", "3", "--set", "train.steps=20", "--task",
                  "reverse", "--preset", "tiny", "--jobs", "1", "--results-dir", "out", "-q")
    req = request_from_args(args)
    assert req.variants == ("baseline", "pre_*") and req.seeds == 3 and req.preset == "tiny" and req.jobs == 1
    assert req.overrides == ("train.steps=20", "train.task='reverse'")
    assert req.given() == {"variants", "seeds", "preset", "jobs", "overrides"}
    assert req.seed_list() == [0, 1, 2] and req.patterns() == ["baseline", "pre_*"]
    # what the API builds for the same call (harness.api.run's conversion of its keyword arguments)
    from harness.request import names, override_items

    api = RunRequest(variants=names(["baseline", "pre_*"]), seeds=3, preset="tiny", jobs=1, results_dir="out",
                     overrides=override_items({"train.steps": 20, "train.task": "reverse"}), quiet=True)
    assert {k: v for k, v in vars(api).items() if k != "command"} == \
        {k: v for k, v in vars(req).items() if k != "command"}
    # nothing given: every option at its documented default, nothing "given"
    bare = request_from_args(_parse("run"))
    assert bare.given() == set() and bare.patterns() == ["all"] and bare.seed_list() == [0]


def test_no_module_below_commands_sees_argv_or_a_namespace():
    """Issue 20's done-when grep, as a test: argv, parse_args and Namespace only in cli.py and commands/."""
    hits = []
    for path in sorted((ROOT / "harness").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "harness/cli.py" or rel.startswith("harness/commands/"):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"argv|parse_args|Namespace|argparse", line):
                hits.append(f"{rel}:{n}: {line.strip()}")
    assert not hits, "\n".join(hits)


def test_bad_requests_are_refused_before_anything_is_stored(tmp_path):
    for req, match in [(RunRequest(retry_failed=True), "--retry-failed needs --resume"),
                       (RunRequest(resume="x", run_id="y"), "--run-id cannot be combined with --resume"),
                       (RunRequest(dtype="fp16"), "--dtype must be one of"),
                       (RunRequest(seeds=0, variants=("baseline",)), "--seeds must be >= 1"),
                       (RunRequest(seeds="2"), "--seeds must be an integer")]:
        with pytest.raises(Exception, match=match):
            launch.start_run(RunRequest(**{**vars(req), "results_dir": str(tmp_path)}))
    assert not any(tmp_path.iterdir())


def _tiny(tmp_path, **kw) -> RunRequest:
    return RunRequest(**{"variants": ("baseline", "pre_norm"), "preset": "tiny", "overrides": ("train.steps=5",),
                         "jobs": 1, "results_dir": str(tmp_path), "run_id": "r", "quiet": True, **kw})


@pytest.mark.parametrize("phase", ["check", "report"])
def test_an_interrupt_in_any_phase_ends_interrupted_with_the_resume_hint(tmp_path, monkeypatch, capsys, phase):
    """Ctrl-C during the pre-training check, SIGTERM while the report is written: exit 130, the resume
    hint, config.json says `interrupted`; resuming then finishes the run."""
    def stop(*a, **k):
        raise KeyboardInterrupt() if phase == "check" else Terminated()

    monkeypatch.setattr(launch, "record_check" if phase == "check" else "write_report", stop)
    code = cli.main(["run", "--variants", "baseline", "pre_norm", "--preset", "tiny", "--set", "train.steps=5",
                     "--jobs", "1", "--results-dir", str(tmp_path), "--run-id", "r", "-q"])
    err = capsys.readouterr().err
    run = tmp_path / "r"
    assert code == 130, err
    what = "interrupted" if phase == "check" else "terminated (SIGTERM)"
    assert f"harness: {what};" in err and f"resume with: python -m harness run --resume {run}" in err
    meta = json.loads((run / "config.json").read_text())
    assert meta["status"] == "interrupted"
    assert len(list((run / "trials").glob("*.json"))) == (0 if phase == "check" else 2)
    monkeypatch.undo()
    assert cli.main(["run", "--resume", str(run), "-q"]) == 0
    assert json.loads((run / "config.json").read_text())["status"] == "complete"
    assert (run / "report.md").is_file()


def test_retry_failed_runs_failed_trials_again_and_keeps_the_old_files(tmp_path, monkeypatch, capsys):
    plugin = tmp_path / "flaky_plugin.py"
    plugin.write_text(textwrap.dedent(FLAKY_PLUGIN))
    monkeypatch.setenv("HARNESS_TEST_BREAK", "1")
    req = _tiny(tmp_path / "results", variants=("baseline", "flaky"), plugins=PluginSpec(files=[str(plugin)]),
                check=False)
    first = launch.start_run(req)
    assert first.exit_code == 1
    (bad,) = first.bad_rows()
    assert bad["variant"] == "flaky" and bad["status"] == "failed" and "broken on purpose" in bad["reason"]
    run = first.store.root
    # the cause is fixed; a plain resume runs nothing (failed trials are stored trials) ...
    monkeypatch.delenv("HARNESS_TEST_BREAK")
    assert launch.start_run(RunRequest(resume=str(run), quiet=True)).exit_code == 1
    # ... --retry-failed runs them again; the old file is kept under trials/retried/
    baseline_before = (run / "trials" / "baseline__s0.json").read_bytes()
    again = launch.start_run(RunRequest(resume=str(run), retry_failed=True, quiet=True))
    assert again.exit_code == 0 and not again.bad_rows()
    assert (run / "trials" / "baseline__s0.json").read_bytes() == baseline_before  # the ok trial not re-run
    (old,) = (run / "trials" / "retried").glob("*.json")
    assert json.loads(old.read_text())["row"]["status"] == "failed"
    meta = json.loads((run / "config.json").read_text())
    assert meta["resumes"][-1]["retried"] == ["flaky__s0"]
    assert cli.main(["verify", str(run)]) == 0
    # the command line: a failed run's message says how to retry
    monkeypatch.setenv("HARNESS_TEST_BREAK", "1")
    code = cli.main(["--plugin", str(plugin), "run", "--variants", "flaky", "--preset", "tiny", "--set",
                     "train.steps=5", "--jobs", "1", "--results-dir", str(tmp_path / "cli"), "-q"])
    assert code == 1 and "--retry-failed" in capsys.readouterr().err
