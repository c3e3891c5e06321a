"""The property table (harness.checks.properties): every row is held to a plugin in tests/plugins/ that has its
fault -- the row fails on it and its failure names the fault -- and to its line in docs/checks.md, which the table
writes; the run gate is that table (TrialGate), in the single-trial loop and the trial groups alike."""
from __future__ import annotations

import re

import pytest
import torch

from harness import train as T
from harness import trialgate
from harness.checks.inputs import CHECK_MODEL, long_rows_of
from harness.checks.policy import GATE_ATOL, GATE_RTOL
from harness.checks.properties.catalogue import PROPERTIES, properties_markdown
from harness.checks.properties.rows import gate_batch, preset_task_rows
from harness.checks.properties.table import (CHECK, PROBE, PROBE_ROWS, TRIAL, VARIANT, WHERE, GateInputs, ProbeInputs,
                                             run_properties)
from harness.config import get_preset
from harness.model import build_model
from harness.plugins import PluginSpec
from harness.registry import Registry

from .conftest import ROOT

PLUGINS = ROOT / "tests" / "plugins"
DOC = ROOT / "docs" / "checks.md"


def _registry(name: str) -> Registry:
    return Registry.from_plugins(PluginSpec(files=[str(PLUGINS / f"{name}.py")], strict=True))


def test_every_row_is_declared_whole():
    names = [p.name for p in PROPERTIES]
    assert len(names) == len(set(names)), "two rows with one name"
    for p in PROPERTIES:
        assert p.kind in (PROBE, VARIANT, TRIAL) and p.where and set(p.where) <= set(WHERE), p.name
        assert p.inputs and p.applies and p.fault and p.names, p.name
        assert (PLUGINS / f"{p.catches}.py").is_file(), f"{p.name}: no plugin tests/plugins/{p.catches}.py"
        assert all(r in names[:names.index(p.name)] for r in p.requires), f"{p.name} requires a later row"


def test_docs_hold_the_table_the_code_declares():
    """docs/checks.md's table between the properties markers is the one the table writes (regenerate it with
    ``python -m harness.checks.properties.catalogue``)."""
    text = DOC.read_text()
    found = re.search(r"<!-- properties:start -->\n(.*?)\n<!-- properties:end -->", text, re.S)
    assert found, "docs/checks.md has no properties markers"
    assert found.group(1).strip() == properties_markdown().strip(), \
        "docs/checks.md's property table is stale: python -m harness.checks.properties.catalogue"


@pytest.mark.parametrize("row", PROBE_ROWS, ids=lambda r: r.name)
def test_each_probe_row_catches_its_plugin_and_names_the_fault(row):
    reg = _registry(row.catches)
    variant = reg.select([row.catches])[0]
    cfg = CHECK_MODEL.validate()
    model = build_model(reg, variant, cfg, seed=0)
    batch = gate_batch(cfg, seed=0)
    with torch.inference_mode():
        scale = float(torch.nan_to_num(model.eval()(batch[0], batch[1]).abs().max(), nan=0.0))
    inputs = ProbeInputs(model, gate_batch(cfg, seed=0, long_rows=0), cfg, GATE_ATOL + GATE_RTOL * scale,
                         long=long_rows_of(batch, 6), task=preset_task_rows(reg, None, cfg), where=CHECK)
    run_properties(inputs)
    result = inputs.results[row.name]
    assert not result.passed, f"{row.catches} passes {row.name}"
    assert row.names in result.detail, result.detail


@pytest.mark.parametrize("row", [p for p in PROPERTIES if p.kind == VARIANT], ids=lambda r: r.name)
def test_each_variant_row_catches_its_plugin_and_names_the_fault(row):
    device = "cuda" if "GPU" in row.name else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("the GPU = CPU row needs CUDA")
    reg = _registry(row.catches)
    variant = reg.select([row.catches])[0]
    cfg = get_preset("tiny").model
    model = build_model(reg, variant, cfg, seed=0).to(device)
    if row.name == "fresh build = trained model":  # a component that changes with use: use it first
        model.train()
        src, tgt, _ = gate_batch(cfg, seed=0)
        for _ in range(150):
            model(src.to(device), tgt.to(device))
    inputs = GateInputs(reg, variant, cfg, 0, torch.device(device), "bf16" if "bf16" in row.name else "fp32", model)
    assert row.when(inputs)
    lines = row.measure(inputs)
    assert lines and row.names in lines[0], lines


def test_the_trial_row_catches_a_mask_honest_only_under_the_checks_after_training_alone():
    """evade_check_stack answers honestly whenever a frame under harness/checks/ is on the stack. With no periodic
    evaluation the final future-leak check alone must catch it: the gate that starts that check lives outside
    harness/checks/ (harness/trialgate.py), or the plugin would pass as ``ok``."""
    (row,) = [p for p in PROPERTIES if p.kind == TRIAL]
    reg = _registry(row.catches)
    cfg = get_preset("tiny").override({"train.steps": 5, "train.eval_every": 0})
    model = build_model(reg, reg.variants[row.catches], cfg.model, seed=0)
    metrics, _ = T.train(model, cfg, seed=0, device=torch.device("cpu"))
    assert metrics["status"] == T.INVALID, metrics["reason"]
    assert "after training" in metrics["reason"] and row.names in metrics["reason"], metrics["reason"]
    assert "at initialisation" not in metrics["reason"]


def test_the_gate_and_the_loop_agree_on_the_invalid_status():
    assert trialgate.INVALID == T.INVALID
