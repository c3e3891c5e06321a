"""BatchNorm in the LayerNorm's place (notes 000, 002 and d2l §10.7.3 ask "why LayerNorm and not
BatchNorm?"): the component is held to BatchNorm's formula in training and evaluation, the model-level
probes flag it in training only and name the BatchNorm statistics as the cause, and a trial of it is
marked invalid for that reason yet trained and scored. A LayerNorm that is one only in evaluation is
caught by the component check itself (tests/plugins/adv_layernorm_batch_stats_in_training.py)."""
from __future__ import annotations

import torch

from harness import checks
from harness import train as T
from harness.config import get_preset
from harness.model import build_model
from harness.registry import Registry
from harness.runner import short_reason, trial_line


def test_batch_norm_conforms_to_its_formula_and_only_its_training_probes_leak():
    reg = Registry.from_plugins()
    assert reg.variants["batchnorm"].group == "questions"
    assert "batchnorm" not in {v.name for v in reg.select(["all"])}
    report = checks.run_checks(reg, reg.select(["batchnorm"]))
    mine = {r.check: r.verdict for r in report.components if r.name == "batchnorm"}
    assert [v for c, v in mine.items() if c.startswith(("training:", "evaluation:"))] == ["conforms", "conforms"]
    assert "differs as declared" in mine.values()
    probes = {(p.probe, p.mode): p for p in report.probes if p.subject == "batchnorm"}
    assert probes[("causal leak", "eval")].passed and probes[("masked source keys", "eval")].passed
    assert not probes[("causal leak", "train")].passed and not probes[("masked source keys", "train")].passed
    failures = report.failures()
    assert len(failures) == 2 and all("(train mode)" in f and "batch statistics of its" in f for f in failures)
    assert "(e.g. decoder." in failures[0] and "mask not applied" not in " ".join(failures)


def test_a_batch_norm_trial_is_invalid_for_its_statistics_but_trained_and_scored():
    reg = Registry.from_plugins()
    cfg = get_preset("tiny")
    model = build_model(reg, reg.variants["batchnorm"], cfg.model, seed=0)
    metrics, _ = T.train(model, cfg, seed=0, device=torch.device("cpu"))
    assert metrics["status"] == T.INVALID
    assert "at initialisation" in metrics["reason"] and "BatchNorm module(s)" in metrics["reason"]
    assert metrics["heldout_ce"] == metrics["heldout_ce"] and 0 <= metrics["exact_match"] <= 1  # scored
    bn = model.encoder.layers[0].sublayer[0].norm
    assert int(bn.num_batches_tracked) == cfg.train.steps  # trained in training mode, its running statistics updated


def test_a_long_reason_is_cut_to_its_first_part_in_the_trial_line():
    parts = [f"reason {i} " + "x" * 120 for i in range(4)]
    line = trial_line({"variant": "v", "seed": 0, "status": "invalid", "reason": "; ".join(parts)}, "p.json", 1, 1, 2.0)
    assert f"({parts[0]}; +3 more in the trial record)" in line
    assert short_reason("short; reason") == "short; reason"
    assert short_reason("y" * 400) == "y" * 400  # one long reason stays whole


def test_the_invalid_section_lists_a_reason_once_whatever_its_sizes():
    import pandas as pd

    from harness.report.frames import invalid_variants

    leak = "at initialisation: decoder position 0 changed (max |Δ logit| {}) when ... (train mode)"
    df = pd.DataFrame({"variant": ["v", "v", "v"], "status": ["invalid"] * 3, "seed": [0, 1, 2],
                       "reason": [leak.format("0.796") + "; after training: x", leak.format("1.37"),
                                  "after training: decoder position 2 changed (max |Δ logit| 3e-05)"]})
    assert invalid_variants(df) == {"v": [leak.format("0.796"),
                                          "after training: decoder position 2 changed (max |Δ logit| 3e-05)"]}
