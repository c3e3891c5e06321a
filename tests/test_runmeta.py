"""A run's ``config.json`` reads as the typed :class:`harness.runmeta.RunMeta` and writes back byte for
byte: every committed reference run round-trips, unknown and foreign-typed keys survive, and a
reader sees "not recorded" (None) where a stored value has the wrong type."""
from __future__ import annotations

import json

import pytest

from harness.runmeta import Execution, Resume
from harness.trial import TrialSpec
from harness.runmeta import RunMeta
from harness.store import RunStore, load_run, read_config_text

from .conftest import ROOT

REFERENCE_CONFIGS = sorted(p for name in ("config.json", "config.json.gz")  # gzip'd where over 90 KB
                           for p in (ROOT / "results" / "reference").glob(f"**/{name}"))


def test_there_are_reference_runs_of_every_kind():
    kinds = {RunMeta.from_dict(json.loads(read_config_text(p))).kind for p in REFERENCE_CONFIGS}
    assert {"train", "check", "bench", "profile", "grad_norm_at_init"} <= kinds


@pytest.mark.parametrize("path", REFERENCE_CONFIGS, ids=lambda p: str(p.parent.relative_to(ROOT / "results")))
def test_every_reference_config_round_trips_byte_for_byte(path):
    text = read_config_text(path)
    d = json.loads(text)
    meta = RunStore.open(path.parent).meta()
    assert isinstance(meta, RunMeta)
    assert meta.to_dict() == d and list(meta.to_dict()) == list(d)
    assert json.dumps(meta.to_dict(), indent=2) == text  # as RunStore.write_meta writes it
    assert meta.extra == {}  # every key the harness wrote is a typed field
    assert RunMeta.from_dict(meta.to_dict()) == meta


def test_a_training_run_reads_typed_records():
    meta = load_run(ROOT / "results" / "reference" / "main-job").meta
    assert meta.is_training and meta.status == "complete" and meta.run_id == "main-job"
    assert isinstance(meta.execution, Execution) and meta.execution.executor == "local"
    assert all(isinstance(t, TrialSpec) for t in meta.trials) and len(meta.planned_keys()) == 11
    assert meta.trials[0].variant == meta.trials[0].key.split("__")[0]
    assert meta.check["classes"] and meta.config_hash and meta.run_wall_s > 0


def test_an_update_rewrites_only_what_changed_in_the_stored_order(tmp_path):
    src = ROOT / "results" / "reference" / "task-sort" / "config.json"
    d = json.loads(src.read_text())
    meta = RunMeta.from_dict(d)
    meta.status = "interrupted"
    meta.resumes = [Resume("python -m harness run --resume x", 2, [], Execution(jobs=2))]
    out = meta.to_dict()
    assert list(out) == list(d) + ["status", "resumes"]  # new keys after the stored ones
    assert {k: v for k, v in out.items() if k not in ("status", "resumes")} == d
    assert out["resumes"] == [{"command": "python -m harness run --resume x", "missing": 2, "retried": [],
                               "execution": {"executor": "local", "jobs": 2, "threads": None, "address": None,
                                             "capture": "auto"}}]
    again = RunMeta.from_dict(json.loads(json.dumps(out)))
    assert again.resumes[0].execution.jobs == 2 and again.status == "interrupted"


def test_unknown_and_foreign_typed_keys_survive_and_read_as_not_recorded():
    d = {"command": "python -m harness run", "plugin_note": {"x": [1, 2]}, "status": 3, "trials": "oops",
         "run_wall_s": True, "execution": {"executor": "local", "jobs": "2", "future": 1}, "seeds": None,
         "config": [], "resumes": [{"missing": 1}]}
    meta = RunMeta.from_dict(d)
    assert meta.to_dict() == d and list(meta.to_dict()) == list(d)
    assert meta.status is None and meta.trials is None and meta.run_wall_s is None and meta.config == {}
    assert meta.execution.jobs == "2" and meta.execution.extra == {"future": 1}  # "auto"-like strings pass
    assert meta.resumes[0].missing == 1 and meta.resumes[0].command == ""
    assert meta.extra == {"plugin_note": {"x": [1, 2]}, "status": 3, "trials": "oops", "run_wall_s": True,
                          "config": []}
    assert RunMeta.from_dict({}).to_dict() == {}


def test_a_planned_trial_without_a_key_makes_the_list_unreadable(tmp_path):
    d = json.loads((ROOT / "results" / "reference" / "task-sort" / "config.json").read_text())
    d["trials"][1] = {"spec": d["trials"][1]["spec"]}  # hand-edited: no key
    meta = RunMeta.from_dict(d)
    assert meta.trials is None and meta.planned_keys() == [] and meta.to_dict() == d


def test_a_record_built_in_code_writes_its_kind_only_when_not_training(tmp_path):
    train = RunMeta("train", "c", "", {}, [], "cpu", {})
    assert train.to_dict() == {"command": "c", "preset": "", "config": {}, "variants": [], "device": "cpu",
                               "environment": {}}
    store = RunStore.create(tmp_path, RunMeta("bench", "c", "tiny", {}, ["a"], "cpu", {}, steps=2), "b1")
    meta = store.meta()
    assert meta.kind == "bench" and meta.run_id == "b1" and meta.steps == 2
    assert list(json.loads((tmp_path / "b1" / "config.json").read_text()))[0] == "kind"


def test_an_undeclared_attribute_is_refused_not_dropped_from_the_file():
    """``bench --group-sizes`` once set ``meta.group_sizes`` without a field of that name: the value lived on
    the object and never reached config.json. A name that is not a field now raises at once."""
    meta = RunMeta("bench", "c", "", {}, [], "cpu", {})
    with pytest.raises(AttributeError, match="no field 'group_size'"):
        meta.group_size = [2]
    meta.group_sizes = [2]
    assert meta.to_dict()["group_sizes"] == [2]
