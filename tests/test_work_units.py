"""The executors' unit of work (harness.executors.units): one trial or one vectorised trial group, run by the same
worker function and read back by the same method, so no executor branches on what a unit holds."""
from __future__ import annotations

import ast
from pathlib import Path

from harness.config import get_preset
from harness.executors.units import WorkUnit, plan_units, run_unit
from harness.trial import TrialSpec

ROOT = Path(__file__).resolve().parents[1]


def _specs(variants=("baseline",), seeds=(0, 1), steps=2):
    cfg = get_preset("tiny").override({"train.steps": steps}).to_dict()
    return [TrialSpec(v, s, cfg, device="cpu", threads=1) for v in variants for s in seeds]


def test_plan_units_makes_one_unit_per_trial_or_per_trial_group():
    specs = _specs(("baseline", "pre_norm"), (0, 1, 2))
    single = plan_units(specs)
    assert [u.specs for u in single] == [[ts] for ts in specs] and not any(u.grouped for u in single)
    grouped = plan_units(specs, vectorise=True, capture="off")
    assert [[ts.seed for ts in u.specs] for u in grouped] == [[0, 1, 2], [0, 1, 2]]
    assert {u.specs[0].variant for u in grouped} == {"baseline", "pre_norm"} and all(u.grouped for u in grouped)


def test_a_single_trial_and_a_group_come_back_in_one_shape():
    for unit in (WorkUnit(_specs(seeds=(0,))), WorkUnit(_specs(seeds=(0, 1)), capture="off")):
        specs, capture = unit.payload()
        out = run_unit(specs, [None] * len(specs), capture)
        assert set(out) >= {"results", "log", "started"}
        results = unit.results(out)
        assert [r.row["seed"] for r in results] == [ts.seed for ts in unit.specs]
        assert all(r.row["status"] == "ok" for r in results), [r.row["reason"] for r in results]


def test_a_failed_unit_fails_every_trial_it_holds():
    unit = WorkUnit(_specs(seeds=(0, 1, 2)), capture="auto")
    results = unit.results(None, "worker process died")
    assert [r.row["status"] for r in results] == ["failed"] * 3
    assert all(r.row["reason"] == "worker process died" for r in results)


def test_no_executor_branches_on_capture_being_none():
    """The unit says what it is; ``capture is None`` tests belong to units.py alone."""
    for path in (ROOT / "harness" / "executors").glob("*.py"):
        if path.name == "units.py":
            continue
        tree = ast.parse(path.read_text())
        found = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Compare)
                 and isinstance(n.left, ast.Name) and n.left.id == "capture"
                 and any(isinstance(c, ast.Constant) and c.value is None for c in n.comparators)]
        assert not found, f"{path.name}:{found}"
