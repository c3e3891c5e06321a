"""One trial record each way: a planned trial is a :class:`harness.trial.TrialSpec` and a finished
one a :class:`harness.trial.TrialResult` everywhere in the harness; plain dicts exist only in the
serialisers (``to_dict``/``from_dict`` in ``harness/trial.py``, the config.json codec of the trial
list, the calls that cross a process or Ray boundary) and in the files.

The check reads the source (AST, no import, well under a second): it fails on a string-key read
of a trial result or a planned trial (``x["row"]``, ``x["curve"]``, ``x["phases"]``, ``x["spec"]``,
``x["key"]``, ``x.get("row")``, ``x.spec[...]``, ``spec["variant"]``, ``spec.get("seed")`` ...)
outside :data:`ALLOWED`. Reading metrics from ``result.row[...]`` is fine: a trial's metrics row
is a plain dict by design (it becomes a ``trials.csv`` row).
"""
from __future__ import annotations

import ast
import functools
import json
from dataclasses import fields
from pathlib import Path

import pytest

from harness.runmeta import Execution, RunMeta
from harness.trial import TrialResult, TrialSpec

from .conftest import ROOT

#: Keys that only a trial result or a config.json trial entry has at its top level.
RECORD_KEYS = frozenset({"row", "curve", "phases", "spec", "key"})
#: A planned trial's fields: read as a dict key from a name such as ``spec`` or ``ts``, it is a
#: spec dict passed around untyped.
SPEC_KEYS = frozenset(f.name for f in fields(TrialSpec))
SPEC_NAMES = ("spec", "ts", "trial", "planned", "entry")

#: (file relative to the repository, function or "*") -> why it may read record dicts by key.
ALLOWED: dict[tuple[str, str], str] = {
    ("harness/trial.py", "*"): "the records' own to_dict/from_dict and the trial-file reader",
    ("harness/runmeta.py", "_decode_planned"): "config.json's trial list ({key, spec}) read into TrialSpecs",
    ("harness/perf/overhead.py", "*"): "the profile dict of profile_trial ({'phases': ...}), not a trial record",
    ("harness/perf/bench.py", "_memory_main"): "the peak-memory measurement's own JSON on stdin, not a trial spec",
    ("harness/suite/run.py", "suite_folder"): "suite.json's 'spec' (the suite file's), not a trial's",
}


def _key(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _receiver_name(node: ast.AST) -> str | None:
    return node.id if isinstance(node, ast.Name) else None


def _is_spec_name(name: str | None) -> bool:
    return name is not None and (name in SPEC_NAMES or name.endswith("_spec"))


def _violation(node: ast.AST) -> str | None:
    """What is wrong with ``node`` (a subscript or a ``.get`` call), or None."""
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
        obj, key = node.value, _key(node.slice)
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
          and node.args):
        obj, key = node.func.value, _key(node.args[0])
    else:
        return None
    if isinstance(obj, ast.Attribute) and obj.attr == "spec":
        return "reads a planned trial's spec as a dict (.spec[...])"
    if key in RECORD_KEYS:
        return f"reads a trial record as a dict ([{key!r}])"
    if key in SPEC_KEYS and _is_spec_name(_receiver_name(obj)):
        return f"reads a trial spec as a dict ({_receiver_name(obj)}[{key!r}])"
    return None


def record_reads(root: Path, allowed=ALLOWED) -> list[str]:
    """``"file:line (function): what"`` for every string-key read of a trial record under
    ``root/harness`` outside ``allowed``."""
    out = []
    for path in sorted((root / "harness").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if (rel, "*") in allowed:
            continue
        for func, node in _walk(_tree(path), "<module>"):
            what = _violation(node)
            if what and (rel, func) not in allowed:
                out.append(f"{rel}:{node.lineno} ({func}): {what}")
    return out


@functools.lru_cache(maxsize=None)
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _walk(node: ast.AST, func: str):
    for child in ast.iter_child_nodes(node):
        inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else func
        yield inner, child
        yield from _walk(child, inner)


def test_no_trial_record_is_read_as_a_dict_outside_the_serialisers():
    assert record_reads(ROOT) == []


def test_the_check_flags_planted_dict_reads(tmp_path):
    pkg = tmp_path / "harness"
    pkg.mkdir()
    (pkg / "a.py").write_text(
        "def on_done(ts, result):\n"
        "    x = result['row']['status']\n"          # a result dict
        "    y = result.get('curve')\n"               # a result dict, .get
        "    z = ts.spec['variant']\n"                # a planned trial's spec dict
        "    w = spec.get('seed')\n"                  # a spec dict by name
        "    ok = result.row['status']\n"             # metrics from the typed result: fine
        "    return ts.variant, ok\n")
    (pkg / "trial.py").write_text("def from_dict(d):\n    return d['row']\n")  # a serialiser: allowed
    found = record_reads(tmp_path)
    assert [f.split(": ", 1)[1] for f in found] == [
        "reads a trial record as a dict (['row'])",
        "reads a trial record as a dict (['curve'])",
        "reads a planned trial's spec as a dict (.spec[...])",
        "reads a trial spec as a dict (spec['seed'])"]
    assert all(f.startswith("harness/a.py:") and "(on_done)" in f for f in found)


def test_the_old_record_classes_are_gone_and_execution_is_declared_once():
    classes = [n.name for p in (ROOT / "harness").rglob("*.py") for n in ast.walk(_tree(p)) if isinstance(n, ast.ClassDef)]
    assert not {"PlannedTrial", "TrialEntry", "ExecutionOptions"} & set(classes)
    assert classes.count("Execution") == 1


@pytest.mark.parametrize("run", ["task-sort", "invalid-variant"])
def test_a_committed_run_reads_as_trial_specs_and_writes_back_the_same_json(run):
    text = (ROOT / "results" / "reference" / run / "config.json").read_text()
    meta = RunMeta.from_dict(json.loads(text))
    assert meta.trials and all(isinstance(t, TrialSpec) for t in meta.trials)
    assert [t.key for t in meta.trials] == [e["key"] for e in json.loads(text)["trials"]]
    assert json.dumps(meta.to_dict(), indent=2) == text  # byte for byte, as RunStore.write_meta writes it
    assert isinstance(meta.execution, Execution) and meta.execution.vectorise_seeds == "auto"  # stored before it
    assert "vectorise_seeds" not in meta.to_dict()["execution"]


def test_a_trial_list_entry_this_version_would_write_differently_stays_as_stored():
    d = json.loads((ROOT / "results" / "reference" / "task-sort" / "config.json").read_text())
    d["trials"][0]["spec"]["future_field"] = 1  # a later version's spec key
    meta = RunMeta.from_dict(d)
    assert meta.trials is None and meta.to_dict() == d  # kept verbatim (extra), never rewritten


def test_execution_options_and_the_stored_record_are_one_class():
    opts = Execution("local", "auto", None, None, "auto").validate().resolved(4, "cpu")
    assert opts.vectorise_seeds == "off" and isinstance(opts.jobs, int)
    stored = Execution.from_dict(opts.to_dict())
    assert stored == opts and stored.to_dict() == {"executor": "local", "jobs": opts.jobs, "threads": None,
                                                   "address": None, "vectorise_seeds": "off", "capture": "auto"}


def test_a_result_round_trips_through_its_dict():
    r = TrialResult({"variant": "b", "seed": 1, "point": "p", "status": "ok"}, [{"step": 1, "loss": 2.0}],
                    {"step": {"s": 0.5, "calls": 1}}, {"model": {"file": "models/b__p__s1.pt"}})
    again = TrialResult.from_dict(json.loads(json.dumps(r.to_dict())))
    assert again == r and again.key == "b__p__s1"
