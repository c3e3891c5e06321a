"""A slot is one declaration (``harness.slots.Slot``): a plugin adds one with ``harness_add_slots`` plus its
code (tests/plugins/new_slot.py), and every slot table derives from the declarations."""
from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

import harness
from harness.checks.contract_base import SLOT_REFERENCES
from harness.checks.contracts import CHECKS, check_component, check_contracts, slot_check
from harness.checks.expectations import registry_groups
from harness.cli import main as cli_main
from harness.config import ModelConfig
from harness.errors import DuplicateNameError, PluginError, UnknownNameError
from harness.model import BuildContext, build_model
from harness.plugins import PluginSpec
from harness.registry import SLOT_DOCS, Component, Registry
from harness.report.frames import SLOT_COLS
from harness.slots import BUILTIN, Slot, main_slots

from .conftest import ROOT

NEW_SLOT = ROOT / "tests" / "plugins" / "new_slot.py"


@pytest.fixture(scope="module")
def reg():
    return Registry.from_plugins(PluginSpec(files=[str(NEW_SLOT)], strict=True))


def test_slot_tables_derive_from_the_declarations():
    assert list(SLOT_DOCS) == list(SLOT_REFERENCES) == [s.name for s in BUILTIN]
    assert main_slots() == ("norm", "embedding", "attention", "mask")
    assert SLOT_COLS == [f"slot_{s}" for s in main_slots()]
    assert {s.name: slot_check(s) for s in BUILTIN} == {s.name: CHECKS[f"check_{s.name}"] for s in BUILTIN}
    assert not hasattr(harness.registry, "SLOTS") and not hasattr(harness.registry, "MAIN_SLOTS")
    assert harness.Slot is Slot and harness.BuildContext is BuildContext


def test_harness_add_slots_adds_a_slot_with_its_default_to_every_variant(reg):
    slot = reg.slots["activation"]
    assert slot.plugin == str(NEW_SLOT) and slot.column == "slot_activation" and not slot.main
    assert reg.defaults["activation"] == "squared_relu"
    assert reg.variants["baseline"].slots["activation"] == "squared_relu"   # resolved with the plugin's default
    assert "activation" not in Registry.from_plugins().slots                 # only where the plugin is loaded


def test_a_new_slot_reaches_the_model_through_the_component_that_asks_for_it(reg):
    model = build_model(reg, reg.variants["primer_ffn"], ModelConfig(d_model=16, h=2, d_ff=32, N=1, vocab=11))
    assert type(model.encoder.layers[0].feed_forward.act).__name__ == "SquaredReLU"


def test_a_new_slot_is_checked_by_the_check_it_names(reg):
    cfg = ModelConfig(d_model=16, h=2, d_ff=32, N=1, vocab=11)
    res = check_contracts(reg, [("activation", "squared_relu"), ("feed_forward", "act_ffn")], cfg)
    assert [(r.slot, r.verdict) for r in res] == [("activation", "conforms"), ("feed_forward", "differs as declared"),
                                                  ("feed_forward", "conforms")]  # its dropout unbiased
    wrong = Component("plain_relu", "activation", lambda ctx: __import__("torch").nn.ReLU())
    assert [r.verdict for r in check_component(wrong, cfg, slot=reg.slots["activation"])] == ["violates its slot"]
    assert registry_groups(reg, {"activation": [{"squared_relu", "other"}]})["activation"] == (
        frozenset({"squared_relu", "other"}),)                                # --equivalent knows the plugin's slot
    missing = dataclasses.replace(reg.slots["activation"], check="check_activation")  # not in harness.checks
    with pytest.raises(PluginError, match="check='check_activation' is not a contract check"):
        check_component(wrong, cfg, slot=missing)


def test_list_shows_the_new_slot_and_run_trains_a_variant_using_it(capsys, tmp_path):
    assert cli_main(["--plugin", str(NEW_SLOT), "list"]) == 0
    out = capsys.readouterr().out
    assert f"activation: the FFN's elementwise nonlinearity (test plugin) [plugin {NEW_SLOT}]" in out
    assert "| activation   | squared_relu (default)" in out
    run_dir = harness.run(variants=["primer_ffn"], seeds=1, preset="tiny", overrides={"train.steps": 5},
                          plugin_files=[str(NEW_SLOT)], results_dir=tmp_path, check=False)
    trial = pd.read_csv(run_dir / "trials.csv").iloc[0]
    assert (trial.status, trial.slot_activation, trial.slot_feed_forward) == ("ok", "squared_relu", "act_ffn")


def test_slot_declarations_are_validated():
    with pytest.raises(DuplicateNameError, match="slot 'norm' is declared by two plugins: 'harness.slots' and 'mine'"):
        Registry(slots=[Slot("norm", "again", object, plugin="mine")])
    with pytest.raises(PluginError, match="not an identifier"):
        Registry(slots=[Slot("my slot", "x", object)])
    with pytest.raises(PluginError, match="protocol must be a class"):
        Registry(slots=[Slot("act", "x", "Activation")])
    ctx = BuildContext(ModelConfig(), {})
    with pytest.raises(UnknownNameError, match="unknown slot 'activation'.*ctx.make"):
        ctx.make("activation")


def test_harness_add_slots_returning_no_slots_is_named(tmp_path):
    bad = tmp_path / "bad_slots.py"
    bad.write_text("from harness import hookimpl\n\n@hookimpl\ndef harness_add_slots():\n    return ['activation']\n")
    with pytest.raises(PluginError, match=r"bad_slots.py:4: harness_add_slots\(\) must return a list of Slot, got a list "
                                          r"holding str"):
        Registry.from_plugins(PluginSpec(files=[str(bad)]))
