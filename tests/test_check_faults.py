"""``check`` names each failing variant with its fault on the terminal, and an undeclared difference
from a slot's reference says how to declare it (``differs=``)."""
from __future__ import annotations

from harness.checks import CheckReport, CheckStage, render_text
from harness.checks.contract_base import DECLARE_HINT
from harness.checks.render import variant_faults
from harness.registry import Variant

from .conftest import ROOT, cli_in_process


def report_failing(lines: list[str], variants: list[str]) -> CheckReport:
    """A check report whose one stage fails with ``lines`` (the rest of the report is never read)."""
    stage = CheckStage("planted", lambda ctx: lines, failures=lambda rep: list(rep.results["planted"]))
    return CheckReport(variants, [], None, "cpu", "fp32", 0, None, "off", results={"planted": lines},
                       stages=(stage,))


def test_faults_go_to_the_variant_they_name_and_a_shared_pair_blames_the_faulty_side():
    variants = [Variant("baseline", {}), Variant("pre", {"norm": "pre"}), Variant("pre_norm", {"norm": "pre"}),
                Variant("mine", {"layer_norm": "my_ln"}), Variant("a", {}), Variant("b", {})]
    lines = ["layer_norm=my_ln [vs nn.LayerNorm(d_model)]: differs from the slot's reference",
             "mine vs baseline: differs unexpectedly (expected equivalent)",
             "layer_norm=my_ln_v2 [vs nn.LayerNorm(d_model)]: differs",  # another component: nobody selected
             "a vs b: differs unexpectedly (expected equivalent)"]       # no own fault on either side: both
    faults = variant_faults(report_failing(lines, [v.name for v in variants]), variants)
    assert faults == {"mine": [lines[0], lines[1]], "a": [lines[3]], "b": [lines[3]]}
    # "pre" is a prefix of "pre_norm", "norm=pre" a prefix of "norm=pre_x": neither matches
    line = "pre_norm: planted failure in norm=pre_x"
    assert variant_faults(report_failing([line], ["pre", "pre_norm"]), variants[1:3]) == {"pre_norm": [line]}

    text = render_text(report_failing(lines, [v.name for v in variants]), 120, None, variants)
    tail = text.split("Failing variants (3 of 6), each with its first fault:\n", 1)[1].splitlines()
    assert tail == [f"  - mine: {lines[0]} (+1 more above)", f"  - a: {lines[3]}", f"  - b: {lines[3]}"]
    assert "Failing variants" not in render_text(report_failing([], ["baseline"]), 120, None, variants[:1])


def test_check_names_the_failing_plugin_variant_and_suggests_differs(tmp_path):
    """A plugin's LayerNorm without eps, declared as nothing: exit 1; the terminal names the variant,
    its fault and how to declare a deliberate difference; the baseline it was compared with is not blamed."""
    plugin = ROOT / "tests" / "plugins" / "adv_layernorm_no_eps.py"
    r = cli_in_process("--plugin", plugin, "check", "--variants", "baseline,adv_layernorm_no_eps",
                       "--results-dir", tmp_path, "-q")
    assert r.returncode == 1, r.stderr
    tail = r.stdout.split("Failing variants (1 of 2), each with its first fault:", 1)[1]
    assert "- adv_layernorm_no_eps: layer_norm=adv_layernorm_no_eps" in " ".join(tail.split())
    assert DECLARE_HINT in " ".join(r.stdout.split()) and "- baseline:" not in tail
