"""The check's kinds as registered stages (issue 20): a new kind of check is one
:class:`~harness.checks.CheckStage`, and the report, its failures, ``checks.csv`` and ``checks.md``
follow the stages given, in their order."""
from __future__ import annotations

import copy

import pytest

from harness.checks import (STAGES, CheckReport, CheckStage, render_markdown, render_text, results_frame, run_checks,
                            stage_registry)
from harness.errors import HarnessError
from harness.runmeta import RunMeta


def planted_stage(name: str = "planted", seen: list | None = None) -> CheckStage:
    """A kind of check that the harness does not know: one result per clean variant, each a failure."""
    def run(ctx):
        if seen is not None:
            seen.append((name, sorted(ctx.results)))
        return [v.name for v in ctx.clean]

    return CheckStage(name, run,
                      failures=lambda rep: [f"{n}: {name} failure" for n in rep.results[name]],
                      rows=lambda rep: [{"section": name, "subject": n, "ok": False} for n in rep.results[name]],
                      markdown=lambda rep: [f"## {name}", ""] + [f"- {n}" for n in rep.results[name]] + [""],
                      log=lambda ctx: f"check: {name}")


def test_a_new_kind_of_check_is_one_registration(registry, small_cfg):
    lines: list[str] = []
    report = run_checks(registry, registry.select(["baseline", "pre_norm"]), small_cfg, log=lines.append,
                        stages=(planted_stage(),))
    assert report.planted == ["baseline", "pre_norm"] == report.results["planted"]
    assert report.failures() == ["baseline: planted failure", "pre_norm: planted failure"] and not report.ok
    assert lines == ["check: planted"]
    df = results_frame(report)
    assert list(df["section"]) == ["planted", "planted"] and list(df["subject"]) == ["baseline", "pre_norm"]
    md = render_markdown(report, RunMeta.from_dict({"run_id": "x", "environment": {}}))
    assert "## planted\n\n- baseline\n- pre_norm\n" in md and md.index("## Tolerances") < md.index("## planted")
    assert md.index("## planted") < md.index("## Result")
    text = render_text(report)
    assert "2 result(s) do not match their declaration:" in text and text.endswith("- pre_norm: planted failure")


def test_stages_run_in_order_and_see_the_results_before_them(registry, small_cfg):
    seen: list = []
    report = run_checks(registry, registry.select(["baseline"]), small_cfg,
                        stages=(planted_stage("first", seen), planted_stage("second", seen)))
    assert seen == [("first", []), ("second", ["first"])]
    assert [s.name for s in report.stages] == ["first", "second"]
    assert report.failures() == ["baseline: first failure", "baseline: second failure"]  # registry order


def test_the_registry_refuses_clashing_stage_names():
    with pytest.raises(HarnessError, match="'pairs'"):
        stage_registry(*STAGES, planted_stage("pairs"))
    for bad in ("variants", "results", "ok", "failures", "not a name"):
        with pytest.raises(HarnessError, match="given twice, is not an identifier or is a CheckReport field"):
            stage_registry(planted_stage(bad))
    extended = stage_registry(*STAGES, planted_stage())
    assert extended[:-1] == STAGES and extended[-1].name == "planted"


def test_the_built_in_stages_hold_every_kind_once():
    names = [s.name for s in STAGES]
    assert len(set(names)) == len(names) and stage_registry(*STAGES) == STAGES
    assert {"components", "runs", "pairs", "probes", "masks", "mha", "transformer", "ties", "devices",
            "bugs"} == set(names)
    # a stage reads the results of the ones before it
    assert names.index("components") < names.index("masks") and names.index("pairs") < names.index("probes")
    assert max(names.index(n) for n in ("components", "runs", "probes", "mha", "transformer")) < names.index("bugs")


def test_a_report_names_an_unknown_stage_and_copies(small_cfg):
    report = CheckReport(variants=[], buggy=[], cfg=small_cfg, device="cpu", dtype="fp32", seed=0, tolerance=None,
                         tf32="off", results={"planted": [1]}, stages=())
    assert report.planted == [1] and copy.copy(report).planted == [1] and copy.deepcopy(report).planted == [1]
    with pytest.raises(AttributeError, match="no field or check stage 'pairs'"):
        report.pairs  # noqa: B018
    assert not hasattr(report, "bugs") and report.failures() == [] and report.classes() == []
