"""run records check's "same function" classes at the model config its trials train, not at the check
config: whether two components compute the same function can depend on h, n_kv_heads, window, ...
(at h = 2 grouped-query attention with h / 2 = 1 K/V head is multi-query attention; with
n_kv_heads = h it is plain multi-head attention)."""
import json

import pytest

import harness
from harness.planning import plan_run
from harness.overview import check_configs
from harness.overview import check_classes, meet
from harness.registry import Registry
from harness.request import RunRequest

ATTENTION = ["baseline", "gqa_attention", "mqa_attention"]


@pytest.fixture(scope="module")
def reg():
    return Registry.from_plugins()


def classes_at(reg, preset, overrides=()):
    plan = plan_run(RunRequest(variants=tuple(ATTENTION), preset=preset, overrides=tuple(overrides)), reg)
    return {frozenset(c) for c in check_classes(reg, plan.variants, configs=check_configs(reg, plan))["classes"]}


def test_classes_follow_the_runs_heads(reg):
    # tiny: h = 2, so gqa's default h / 2 K/V heads is one head: mqa's function
    assert frozenset({"gqa_attention", "mqa_attention"}) in classes_at(reg, "tiny")
    # quick: h = 4, gqa keeps 2 K/V heads: three functions
    assert classes_at(reg, "quick") == {frozenset({v}) for v in ATTENTION}
    # n_kv_heads = h: gqa is multi-head attention, the baseline's function
    assert frozenset({"baseline", "gqa_attention"}) in classes_at(reg, "quick", ["model.n_kv_heads=4"])


def test_a_sweep_over_model_keys_groups_only_what_is_equal_at_every_point():
    assert meet([[["a", "b", "c"], ["d"]], [["a", "b"], ["c", "d"]]]) == [["a", "b"], ["c"], ["d"]]
    assert meet([[["a"], ["b"]]]) == [["a"], ["b"]]


def test_the_runs_report_names_the_config_and_the_class(tmp_path):
    run_dir = harness.run(variants=ATTENTION, seeds=1, preset="tiny", overrides={"train.steps": 3},
                          results_dir=tmp_path, device="cpu")
    check = json.loads((run_dir / "config.json").read_text())["check"]
    assert ["gqa_attention", "mqa_attention"] in check["classes"]
    assert check["models"][0]["h"] == 2 and check["models"][0]["d_model"] == 16
    report = (run_dir / "report.md").read_text()
    assert "at N = 1, d_model = 16, h = 2, d_ff = 32;" in report
    assert "- class 1: gqa_attention, mqa_attention" in report
