"""Plugins written to slip past the checks (tests/plugins/adv_*.py) are caught, for the right reason;
correct plugins written from scratch (tests/plugins/good_*.py) pass with no flags; ``run`` marks a
leaking plugin invalid and never ranks it; a leak that opens only during training is caught after
training and the final exact match is real greedy decoding.

The plugins are loaded by file, as a user would (``--plugin``), and none of them is declared buggy.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pandas as pd
import pytest
import torch

from harness import checks
from harness import train as T
from harness.checks import gate as G
from harness.config import get_preset
from harness.model import build_model
from harness.plugins import PluginSpec
from harness.registry import Registry
from harness.trial import TrialSpec
from harness.tasks.base import evaluate, loss_fn

from .conftest import ROOT, cli_in_process
from .tasks_by_name import eval_set

PLUGINS = ROOT / "tests" / "plugins"

#: plugin -> words the first failure line must contain: the fault named, not only "something differs"
FAULTS = {
    "adv_lm_causal_peek": "shifted by +1: position i attends to position i+1",
    "adv_prefix_sees_target": "a source position sees the target",
    "adv_scale_d_model": "divided by d_model instead of sqrt(d_k)",
    "adv_init_global_rng": "the scheme draws from the global RNG",
    "adv_causal_shift": "shifted by +1: position i attends to position i+1",
    "adv_causal_shift_minus": "shifted by -1: position i cannot attend to itself",
    "adv_src_pad_ignored": "padding mask blocks nothing",
    "adv_nan_rows": "NaN at padded query positions",
    "adv_gated_leak": "outside the canonical layout",
    "adv_length_embedding": "not a per-token lookup of tgt.weight",
    "adv_heads_no_transpose": "without transpose",
    "adv_softmax_dim": "softmax taken over the query axis",
    "adv_mask_after_softmax": "mask applied after the softmax",
    "adv_eval_only_mask": "(train mode): it sees the future",
    "adv_kv_swapped": "keys and values swapped",
    "adv_prenorm_no_final": "declares final_norm = False",
    "adv_layernorm_wrong_axis": "normalised over (L, d_model)",
    "adv_layernorm_no_eps": "differs from the slot's reference (nn.LayerNorm",
    "adv_positional_off_by_one": "PE shifted by one position",
    "adv_unscaled_still_scaled": "embeddings scaled by sqrt(d_model) although the formula has no scale",
    "adv_no_positions_rotates": "inside self-attention: scores q_rot k_rot^T (unchanged)",
    "adv_scale_in_bf16": "under bf16 autocast the logits move",
    "adv_pe_wraps": "right up to position 15, wrong from position 16 on",
    "adv_attention_chunks_16": "right for query positions 0 to 15, wrong from position 16 on",
    "adv_causal_leak_after_16": "decoder position 16 changed",
    "adv_embedding_scales_after_16": "tgt(ids) is not a per-token lookup of tgt.weight: right up to position 15, wrong",
    "adv_ffn_mixes_after_16": "right up to position 15, wrong from position 16 on",
    "adv_layernorm_mixes_after_16": "right up to position 15, wrong from position 16 on",
    "adv_dropout_no_rescale": "with dropout on, the mean training output is 0.5",
    "adv_keys_detached_in_bf16": "get no gradient that they get in float32 (e.g. encoder.layers.0.self_attn.w_k",
    "adv_float64_only": "right in float64 but not in float32",
    "adv_fold_mask_repeat": "folded into the heads with repeat()",
    "adv_functional_dropout": "eval mode is not deterministic",
    "adv_batch_size_gaming": "the model's output depends on the batch it is in",
    "adv_rope_half_split": "RoPE in the half-split layout (GPT-NeoX / LLaMA-HF rotate_half)",
    "adv_alibi_wrong_heads": "ALiBi slopes computed for 8 heads instead of h = 4",
    "adv_rope_on_v": "RoPE applied to the values too",
    "adv_rope_after_transpose": "RoPE applied to k after the transpose for Q K^T",
    "adv_swiglu_swapped": "gate and up projections swapped",
    "adv_gqa_tiled": "K/V heads tiled with repeat()",
    "adv_rope_base": "RoPE base 1000 instead of 10000",
    "adv_rope_k_only": "RoPE applied to k only",
    "adv_alibi_linear_slopes": "ALiBi slopes linear in the head index",
    "adv_swiglu_no_act": "no activation on the gate",
    "adv_rmsnorm_eps_outside": "eps added outside the square root",
    "adv_window_off_by_one": "a window of w + 1 keys",
    "adv_qk_norm_d_model": "QK-norm statistics over d_model",
    "adv_parallel_two_norms_sequential": "sequential pre-norm: each sub-layer reads LayerNorm of the previous",
    "adv_unscaled_renamed": "does not export the canonical layout",
    "adv_layernorm_batch_stats_in_training": "normalised with the batch's statistics in training",
    "adv_batchnorm_per_position": "statistics per position (over the batch only)",
    "adv_scale_in_training": "the training-mode logits differ from the evaluation-mode ones",
    "adv_keys_detached_in_training": "self_attn.w_k.weight gets none in training",
    "adv_scale_in_inference": "under torch.inference_mode, as held-out scores are computed, differ",
    "adv_scale_large_batch": "the model's output depends on the batch it is in",
    "adv_rows_by_index": "the model's output depends on the batch it is in",
    "adv_single_query_scale": "from a decoder input that ends there (width 1",
    "adv_ffn_straight_through": "the backward is not the derivative of the forward",
    "adv_start_symbol_leak": "decoder position 0 changed",
    "adv_source_without_specials": "on rows the task drew: real target positions changed",
    "adv_causal_without_specials": "the mask depends on what the batch holds",
    "adv_qk_norm_no_gain": "the component has no parameter q_norm.weight, k_norm.weight",
    "adv_qk_norm_gain_unused": "QK-norm gains q_norm.weight, k_norm.weight never applied",
    "adv_nan_in_training": "non-finite output in training mode",
    "adv_parallel_two_norms": "a LayerNorm for each sub-layer",
    "adv_alibi_slopes_over_h": "ALiBi: one slope m = 0.25 = 1/H for every head",
}
GOOD = sorted(p.stem for p in PLUGINS.glob("good_*.py"))


def _registry(*names: str) -> Registry:
    return Registry.from_plugins(PluginSpec(files=[str(PLUGINS / f"{n}.py") for n in names], strict=True))


def test_every_adversarial_plugin_has_an_expected_fault():
    assert sorted(FAULTS) == sorted(p.stem for p in PLUGINS.glob("adv_*.py"))


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_check_catches_the_undeclared_fault_and_names_it(name):
    reg = _registry(name)
    assert not reg.variants[name].buggy and not any(c.buggy for c in reg.components.values() if c.plugin.endswith(f"{name}.py"))
    report = checks.run_checks(reg, reg.select([name]))
    failures = report.failures()
    assert failures, f"{name} slipped past every check"
    assert FAULTS[name] in failures[0], failures[0]
    assert not [f for f in failures if "harness/checks/" in f], f"the checker itself crashed: {failures}"


@pytest.mark.parametrize("name", GOOD)
def test_correct_plugins_written_from_scratch_pass_without_flags(name):
    """Each passes with no flags; one with a built-in twin (``TWIN``: RoPE, ALiBi, RMSNorm, SwiGLU) is measured
    the same function as the twin and shares its equivalence class, whatever the two declare."""
    twin = re.search(r'^TWIN = "(\w+)"', (PLUGINS / f"{name}.py").read_text(), re.M)
    reg = _registry(name)
    report = checks.run_checks(reg, reg.select([name, "baseline"] + ([twin.group(1)] if twin else [])))
    assert report.failures() == []
    comp = next(c for c in reg.components.values() if c.plugin.endswith(f"{name}.py"))
    if twin:
        assert sorted([name, twin.group(1)]) in [sorted(c) for c in report.classes()], report.classes()
        assert "baseline" not in next(c for c in report.classes() if name in c)
    if comp.differs and comp.reference:  # held to the formula it names
        assert {r.verdict for r in report.components if r.name == comp.name} >= {"conforms"}
    elif comp.differs:  # RMSNorm: the size of the declared difference is reported, not hidden
        res = [r for r in report.components if r.name == comp.name and not r.check.startswith("training mode")]
        assert res and all(r.verdict == "differs as declared" and r.max_abs > 1e-3 for r in res)
        if comp.slot == "layer_norm":  # and it is the same function in training as in evaluation
            assert {r.verdict for r in report.components if r.name == comp.name and r.check.startswith(
                "training mode")} == {"conforms"}
    elif comp.slot == "attention" and report.pairs[0].verdict == "not comparable":  # shapes of its own (MQA)
        assert "no canonical counterpart" in report.pairs[0].notes[0]
        assert sorted(report.classes()) == [["baseline"], [name]]
        assert {r.verdict for r in report.mha} == {"equivalent"}  # through repeated K/V rows
    elif comp.slot == "attention":  # held to nn.MultiheadAttention with every mask in use
        assert [p.verdict for p in report.pairs] in (["identical"], ["equivalent"])
        assert [sorted(c) for c in report.classes()] == [sorted([name, "baseline"])]


def test_two_rope_layouts_are_one_function_only_with_the_permutation_declared():
    """Half-split RoPE (GPT-NeoX / LLaMA-HF) is RoFormer's interleaved RoPE only after permuting the rows of
    W_q and W_k: declared with qk_order() it is the same function as the built-in rope (one class); the
    same code without the declaration is a different function, and check names the layout."""
    reg = _registry("good_rope_half_split", "adv_rope_half_split")
    report = checks.run_checks(reg, reg.select(["good_rope_half_split", "rope_positions"]))
    assert report.ok and [p.verdict for p in report.pairs] in (["identical"], ["equivalent"])
    undeclared = checks.run_checks(reg, reg.select(["adv_rope_half_split", "rope_positions"]))
    assert [p.verdict for p in undeclared.pairs] == ["differs as declared"]
    assert "half-split layout" in undeclared.failures()[0]


def test_check_of_a_clean_variant_ignores_unrelated_buggy_plugins(tmp_path):
    files = [str(p) for p in sorted(PLUGINS.glob("adv_*.py"))]
    cmd = [sys.executable, "-m", "harness"]
    for f in files:
        cmd += ["--plugin", f]
    proc = subprocess.run(cmd + ["check", "--variants", "baseline", "-q", "--results-dir", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    proc = subprocess.run(cmd + ["check", "--variants", "baseline", "adv_scale_d_model", "-q",
                                 "--results-dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "scores divided by d_model instead of sqrt(d_k)" in " ".join(proc.stdout.split())  # lines wrap at 120
    assert "adv_causal_shift" not in proc.stdout  # out of scope: not selected, not used


def test_all_components_sweeps_every_installed_component():
    reg = _registry("adv_kv_swapped", "good_rmsnorm")
    scoped = checks.run_checks(reg, reg.select(["baseline"]))
    assert scoped.ok and {r.name for r in scoped.components} <= {"annotated", "bool", "post", "separate", "torch",
                                                                 "scaled", "biased", "relu", "xavier", "encoder_decoder"}
    swept = checks.run_checks(reg, reg.select(["baseline"]), all_components=True)
    assert any("keys and values swapped" in f for f in swept.failures())


LEAKING = ["adv_scale_d_model", "adv_causal_shift", "adv_src_pad_ignored", "adv_nan_rows", "adv_length_embedding",
           "adv_scale_in_training", "adv_scale_in_inference", "adv_scale_large_batch", "adv_single_query_scale",
           "adv_source_without_specials"]


def test_run_marks_leaking_plugins_invalid_and_never_ranks_them(tmp_path):
    """Ten undeclared faults in one run (one process, 5 paired seeds): each variant is invalid on
    every seed, its numbers are visible, and no report row gives it a verdict; the baseline is ok."""
    seeds = 5
    cmd = []
    for name in LEAKING:
        cmd += ["--plugin", str(PLUGINS / f"{name}.py")]
    cmd += ["run", "--variants", "baseline", *LEAKING, "--seeds", str(seeds), "--preset", "tiny", "-q",
            "--results-dir", str(tmp_path), "--run-id", "r", "--no-check"]  # check's classes: tests/test_suite.py
    proc = cli_in_process(*cmd, cwd=ROOT)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert (f"INVALID (excluded from every verdict; see the report's 'Invalid variants'): {', '.join(sorted(LEAKING))}"
            in proc.stderr)
    trials = pd.read_csv(tmp_path / "r" / "trials.csv")
    assert set(trials[trials["variant"] == "baseline"]["status"]) == {"ok"}
    report = (tmp_path / "r" / "report.md").read_text()
    assert report.index("## Invalid variants") < report.index("## Results")
    for name in LEAKING:
        mine = trials[trials["variant"] == name]
        assert len(mine) == seeds and set(mine["status"]) == {"invalid"}, name
        assert mine["heldout_ce"].notna().all()  # it trained: its numbers are visible
        rows = [line for line in report.splitlines() if line.startswith(f"| {name} ")]
        assert any("**INVALID**" in r for r in rows), name
        assert not any("better" in r or "worse" in r for r in rows), name


def test_a_gradient_only_fault_fails_its_pair_on_both_draws():
    """adv_ffn_straight_through's logits equal the baseline's and its gradients do not: the pair is drawn again
    (a kink flip would not recur) and fails again."""
    reg = _registry("adv_ffn_straight_through")
    report = checks.run_checks(reg, reg.select(["baseline", "adv_ffn_straight_through"]))
    (pair,) = report.pairs
    assert not pair.ok and pair.logits.within and not pair.grad_worst.within, pair


def test_a_mask_keyed_on_real_batches_is_not_the_baselines_function():
    """evade_real_batch_mask hides source position 0 only on batches without a start/end symbol in any source (every
    real batch): the drawn batch finds it equal to the baseline, the rows the task drew (their own forward) do not."""
    reg = _registry("evade_real_batch_mask")
    report = checks.run_checks(reg, reg.select(["baseline", "evade_real_batch_mask"]))
    pair = next(p for p in report.pairs if {p.a, p.b} == {"baseline", "evade_real_batch_mask"})
    assert not pair.ok and "on rows the task drew" in " ".join(pair.notes), pair
    assert ["baseline", "evade_real_batch_mask"] not in [sorted(c) for c in report.classes()]
    drawn_only = checks.run_checks(reg, reg.select(["baseline", "evade_real_batch_mask"]), task_rows=None)
    assert drawn_only.failures() == []  # what check saw before: the drawn batch alone finds no difference


def test_a_leak_that_opens_during_training_is_caught_after_training(registry):
    """adv_gated_leak is causal at initialisation (its gate starts at 0) and leaks once trained: the
    gate after training marks it invalid, and its final exact match is real greedy decoding."""
    reg = _registry("adv_gated_leak")
    cfg = get_preset("tiny").override({"train.steps": 300})
    model = build_model(reg, reg.variants["adv_gated_leak"], cfg.model, seed=0)
    metrics, _ = T.train(model, cfg, seed=0, device=torch.device("cpu"))
    assert metrics["status"] == T.INVALID
    assert "after training" in metrics["reason"] and "at initialisation" not in metrics["reason"]
    data = eval_set(cfg.train.task, cfg.train.eval_sequences, cfg.train.seq_len, cfg.model.vocab, cfg.train.eval_seed)
    greedy = evaluate(model, data, cfg, torch.device("cpu"), "fp32", causal=False)["exact_match"]
    assert metrics["exact_match"] == pytest.approx(greedy)
    assert metrics["exact_match_method"] == T.EM_PREFIX


def test_compare_gates_an_invalid_candidate(tmp_path, capsys):
    from harness import cli

    plugin = ["--plugin", str(PLUGINS / "adv_causal_shift.py")]
    for run_id, variant in (("a", "baseline"), ("b", "adv_causal_shift")):
        cli.main(plugin + ["run", "--variants", variant, "--preset", "tiny", "-q", "--results-dir", str(tmp_path),
                           "--run-id", run_id, "--no-check"])
    meta = json.loads((tmp_path / "b" / "config.json").read_text())
    assert meta["variants"] == ["adv_causal_shift"]
    # rename B's variant so the two runs share it: the candidate is "baseline" with a leaking mask
    from harness.trial import trial_checksum

    for p in (tmp_path / "b" / "trials").glob("*.json"):
        t = json.loads(p.read_text())
        t["row"]["variant"] = "baseline"
        t.pop("checksum", None)
        t["checksum"] = trial_checksum(t)  # a deliberate edit, re-signed (the store quarantines tampered files)
        p.unlink()
        (p.parent / p.name.replace("adv_causal_shift", "baseline")).write_text(json.dumps(t))
    capsys.readouterr()
    code = cli.main(["compare", str(tmp_path / "a"), str(tmp_path / "b")])
    assert code == 1 and "invalid (integrity probes)" in capsys.readouterr().out


def test_run_treats_correct_plugins_like_built_ins(tmp_path):
    good = ["good_d2l_attention", "good_rmsnorm", "good_mqa"]
    cmd = [sys.executable, "-m", "harness"]
    for name in good:
        cmd += ["--plugin", str(PLUGINS / f"{name}.py")]
    proc = subprocess.run(cmd + ["run", "--variants", "baseline", *good, "--preset", "tiny", "-q", "--results-dir",
                                 str(tmp_path), "--run-id", "r"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    trials = pd.read_csv(tmp_path / "r" / "trials.csv")
    assert set(trials["status"]) == {"ok"} and set(trials["variant"]) == {"baseline", *good}
    assert "## Invalid variants" not in (tmp_path / "r" / "report.md").read_text()


def test_declaring_equivalence_to_a_reference_component_does_not_exempt_a_wrong_one(tmp_path):
    """A wrong attention that claims equivalent_to= a component held to the slot's reference is held to
    the reference itself (a declaration cannot buy an exemption)."""
    src = (PLUGINS / "adv_scale_d_model.py").read_text()
    src = src.replace('"adversarial test plugin")]', '"adversarial test plugin", equivalent_to="annotated")]', 1)
    assert 'equivalent_to="annotated"' in src
    f = tmp_path / "claims_equivalence.py"
    f.write_text(src)
    reg = Registry.from_plugins(PluginSpec(files=[str(f)], strict=True))
    report = checks.run_checks(reg, reg.select(["adv_scale_d_model"]))
    assert report.failures() and "divided by d_model instead of sqrt(d_k)" in report.failures()[0]


def test_a_mask_that_is_causal_only_under_the_checks_is_caught_by_the_evaluation(tmp_path):
    """evade_check_stack answers every forward from harness/checks/ honestly (check passes: the
    limit of input-based probes) and leaks everywhere else; the future-leak check of the held-out
    evaluation (real data, outside harness/checks/) marks it invalid, and no report ranks it."""
    reg = _registry("evade_check_stack")
    assert checks.run_checks(reg, reg.select(["evade_check_stack"])).failures() == []
    cfg = get_preset("tiny")
    model = build_model(reg, reg.variants["evade_check_stack"], cfg.model, seed=0)
    metrics, _ = T.train(model, cfg, seed=0, device=torch.device("cpu"))
    assert metrics["status"] == T.INVALID
    assert "differ from the prefix-only logits" in metrics["reason"] and "at step 10" in metrics["reason"]
    assert "at initialisation" not in metrics["reason"]  # the gate's probes were fooled, as designed


def test_a_leak_only_inside_the_training_step_buys_no_score(monkeypatch):
    """evade_train_step leaks only inside harness.train.train_step: no forward the harness inspects
    leaks, so it is not detected (the documented limit). Teacher-forced, its leak would score far
    better than the baseline; its held-out scores are prefix-only, so it scores far worse."""
    reg = _registry("evade_train_step")
    cfg = get_preset("quick").override({"train.steps": 200, "train.eval_every": 100})
    out = {}
    for name in ("baseline", "evade_train_step"):
        model = build_model(reg, reg.variants[name], cfg.model, seed=0)
        out[name], _ = T.train(model, cfg, seed=0, device=torch.device("cpu"))
    cheat, base = out["evade_train_step"], out["baseline"]
    assert cheat["status"] == "ok"  # not detected: no inspected forward leaks
    plugin = sys.modules[next(c.factory.__module__ for c in reg.components.values() if c.name == "evade_train_step")]
    monkeypatch.setattr(plugin, "_in_training_step", lambda: True)  # the forward it trains with
    data = eval_set(cfg.train.task, cfg.train.eval_sequences, cfg.train.seq_len, cfg.model.vocab, cfg.train.eval_seed)
    model.eval()
    with torch.no_grad():
        leaky = float(loss_fn(model(data.src, data.tgt), data.tgt_y, 0, 0.0))
    assert leaky < base["heldout_ce"]  # teacher-forced, the leak would rank it first (0.12 vs 0.15)
    assert cheat["heldout_ce"] > 3 * base["heldout_ce"]  # prefix-only, it is last by far (1.35)
    assert cheat["exact_match"] <= base["exact_match"]


def test_an_embedding_that_memorises_answers_between_forwards_is_caught():
    """evade_memorise is causal and honest in every single forward but answers a sequence it has
    been shown before from a Python dict; check passes, the state half of the evaluation's
    future-leak check (the prefix-only pass repeated) marks it invalid."""
    reg = _registry("evade_memorise")
    assert checks.run_checks(reg, reg.select(["evade_memorise"])).failures() == []
    cfg = get_preset("tiny")
    model = build_model(reg, reg.variants["evade_memorise"], cfg.model, seed=0)
    metrics, _ = T.train(model, cfg, seed=0, device=torch.device("cpu"))
    assert metrics["status"] == T.INVALID, metrics["reason"]
    assert "keeps state between forwards" in metrics["reason"] and "at step 10" in metrics["reason"]


def test_a_factory_that_hands_out_two_different_components_is_caught_at_build():
    """evade_two_faces gives every other model build a wrong attention (one class, a per-instance
    flag): a trial builds the variant twice from its seed and the two models disagree."""
    reg = _registry("evade_two_faces")
    cfg = get_preset("tiny")
    spec = {"variant": "evade_two_faces", "slots": dict(reg.variants["evade_two_faces"].slots),
            "config": cfg.to_dict(), "seed": 0, "device": "cpu", "dtype": "fp32",
            "plugins": PluginSpec(files=[str(PLUGINS / "evade_two_faces.py")], strict=True).to_dict()}
    row = T.run_trial(TrialSpec.from_dict(spec)).row
    assert row["status"] == T.INVALID
    assert "two builds of the variant from seed 0 differ in their outputs" in row["reason"]
    base = build_model(reg, reg.variants["baseline"], cfg.model, seed=0)  # an honest variant passes
    assert G.twin_reasons(reg, reg.variants["baseline"], cfg.model, 0, base, torch.device("cpu")) == []


def test_a_component_that_changes_with_use_is_caught_after_training_and_only_then():
    """evade_scale_after_calls switches its attention's scale after 100 training-mode calls: check passes (every
    component is fresh there), the held-out future-leak check sees nothing (no change between its two passes), and
    the trial is invalid for one reason, the drift gate: a fresh build with the trained parameters computes
    something else. Under the limit (20 steps) the same plugin trains ok, and the baseline is never flagged."""
    reg = _registry("evade_scale_after_calls")
    assert checks.run_checks(reg, reg.select(["evade_scale_after_calls"])).failures() == []
    plugins = PluginSpec(files=[str(PLUGINS / "evade_scale_after_calls.py")], strict=True).to_dict()
    rows = {}
    for name, steps in (("evade_scale_after_calls", 150), ("evade_scale_after_calls", 20), ("baseline", 150)):
        cfg = get_preset("tiny").override({"train.steps": steps})
        spec = {"variant": name, "slots": dict(reg.variants[name].slots), "config": cfg.to_dict(), "seed": 0,
                "device": "cpu", "dtype": "fp32", "plugins": plugins}
        rows[name, steps] = T.run_trial(TrialSpec.from_dict(spec)).row
    bombed = rows["evade_scale_after_calls", 150]
    assert bombed["status"] == T.INVALID and bombed["reason"].startswith("drift: after training"), bombed["reason"]
    assert ";" not in bombed["reason"]  # the one reason: nothing else saw it
    assert rows["evade_scale_after_calls", 20]["status"] == "ok", rows["evade_scale_after_calls", 20]["reason"]
    assert rows["baseline", 150]["status"] == "ok"


def test_a_component_that_changes_with_use_is_caught_in_a_trial_group_too(tmp_path):
    """A vectorised group trains one functional base module for all its seeds, and that module's state is what
    drifts: the drift gate runs each seed through it (GroupStep.seed_forward), so both seeds are invalid."""
    proc = cli_in_process("--plugin", str(PLUGINS / "evade_scale_after_calls.py"), "run", "--variants",
                          "evade_scale_after_calls", "--preset", "tiny", "--set", "train.steps=150", "--seeds", "2",
                          "--vectorise-seeds", "on", "-q", "--results-dir", str(tmp_path), "--run-id", "g",
                          "--no-check", cwd=ROOT)
    assert proc.returncode == 1, proc.stderr[-2000:]
    trials = pd.read_csv(tmp_path / "g" / "trials.csv")
    assert set(trials["status"]) == {"invalid"} and trials["vectorised"].all()
    assert trials["reason"].str.startswith("drift: after training").all(), list(trials["reason"])


@pytest.mark.parametrize("name", ["adv_ffn_mixes_after_16", "adv_layernorm_mixes_after_16"])
def test_a_layer_that_mixes_positions_only_in_long_rows_fails_the_gate_where_rows_are_long(name):
    """The feed-forward and layer-norm contracts feed ``max_len`` positions: the run gate names the first wrong
    position at the g2p and quick presets (max_len 24 and 64), and says nothing at ``tiny`` (max_len 16), where
    the layer is position-wise over every row the model can take (it is the paper's function there)."""
    reg = _registry(name)
    for preset, expect in (("g2p", "(of 24)"), ("quick", "(of 64)")):
        reasons = G.contract_reasons(reg, reg.variants[name], get_preset(preset).model)
        assert reasons and "right up to position 15, wrong from position 16 on " + expect in reasons[0], reasons
    assert G.contract_reasons(reg, reg.variants[name], get_preset("tiny").model) == []


def test_a_mask_that_leaks_only_in_long_rows_fails_the_run_gate_where_rows_are_long():
    """The run gate's batch has 2 rows as long as ``max_len``: a causal mask that leaks from position 16 on is
    named at the quick preset (max_len 64) and passes at ``tiny`` (max_len 16: no row reaches position 16)."""
    from harness.checks.properties.trial_rows import integrity_reasons

    reg = _registry("adv_causal_leak_after_16")
    variant = reg.variants["adv_causal_leak_after_16"]
    for preset, leaks in (("quick", True), ("tiny", False)):
        cfg = get_preset(preset).model
        reasons = integrity_reasons(build_model(reg, variant, cfg), cfg, "cpu")
        assert bool(reasons) == leaks, (preset, reasons)
        assert not leaks or "decoder position 16 changed" in reasons[0], reasons


def test_an_attention_that_never_asks_for_positions_fails_only_where_it_drops_them():
    """good_annotated_attention predates ctx.positions: with additive positions it passes (its RoPE and ALiBi
    cases say "takes no positions"); paired with RoPE the model contract fails -- the model would have no
    positions at all -- and says so."""
    from harness.registry import Variant

    reg = _registry("good_annotated_attention")
    cases = [r for r in checks.run_checks(reg, reg.select(["good_annotated_attention"])).components
             if r.name == "good_annotated_attention" and "positions" in r.check]
    assert cases and all(r.ok and r.verdict == "takes no positions" for r in cases)
    paired = Variant("annotated_with_rope", {"attention": "good_annotated_attention", "positional": "rope"})
    failures = checks.run_checks(reg, [paired]).failures()
    assert any("acts inside attention but attention=good_annotated_attention never calls ctx.positions" in f
               for f in failures), failures


def test_parameters_without_canonical_names_fail_every_comparison_with_a_reason_not_a_keyerror():
    """``adv_unscaled_renamed`` names its projections ``q, k, v, o``: every comparison that needs the canonical
    weights fails and says why; the nn.Transformer comparison names the parameter with no counterpart there
    (it raised a bare ``KeyError`` inside the check before)."""
    reg = _registry("adv_unscaled_renamed")
    failures = checks.run_checks(reg, reg.select(["adv_unscaled_renamed"])).failures()
    assert not any("KeyError" in f for f in failures), failures
    stack = [f for f in failures if "vs nn.Transformer" in f]
    assert stack and all("self_attn.k.bias' has no counterpart there" in f and "canonical parameter names" in f
                         for f in stack), stack


def test_a_bf16_run_marks_autocast_only_faults_invalid_and_a_float32_run_does_not(tmp_path):
    """The two faults that act only under bf16 autocast: ``run --dtype bf16`` stores their trials as invalid
    with the gate's "precision:" reason and the baseline ok; the same plugins in a float32 run are ok (they
    are the paper's attention there), so the item applies where the trial's precision needs it."""
    names = ["adv_scale_in_bf16", "adv_keys_detached_in_bf16"]
    plugins = [a for n in names for a in ("--plugin", str(PLUGINS / f"{n}.py"))]
    for dtype, status in (("bf16", "invalid"), ("fp32", "ok")):
        proc = cli_in_process(*plugins, "run", "--variants", "baseline", *names, "--preset", "tiny", "--dtype", dtype,
                              "-q", "--results-dir", str(tmp_path), "--run-id", dtype, "--no-check", cwd=ROOT)
        assert proc.returncode == (1 if status == "invalid" else 0), proc.stderr[-2000:]
        trials = pd.read_csv(tmp_path / dtype / "trials.csv").set_index("variant")
        assert trials.loc["baseline", "status"] == "ok"
        for name in names:
            assert trials.loc[name, "status"] == status, (dtype, name, trials.loc[name, "reason"])
            if status == "invalid":
                assert str(trials.loc[name, "reason"]).startswith("precision: under bf16 autocast"), name


def test_a_second_trial_in_the_same_process_gets_the_same_reasons():
    """The gate's per-process caches hand out copies: before, the trial extended the cached list in place, so a
    variant failing its contract got the reason once for its first seed, twice for its second, ... in a worker."""
    name = "adv_unscaled_still_scaled"
    reg = _registry(name)
    cfg = get_preset("tiny")
    plugins = PluginSpec(files=[str(PLUGINS / f"{name}.py")], strict=True).to_dict()
    reasons = [T.run_trial(TrialSpec.from_dict({"variant": name, "slots": dict(reg.variants[name].slots),
                                                "config": cfg.to_dict(), "seed": seed, "device": "cpu",
                                                "dtype": "fp32", "plugins": plugins})).row["reason"] for seed in (0, 1, 2)]
    assert reasons[0].startswith("contract: ") and reasons[0].count("contract: ") == 1, reasons[0]
    assert reasons[1] == reasons[2] == reasons[0]


def _gpu_trial(name: str, device: str) -> dict:
    reg = _registry("evade_scale_on_gpu")
    spec = {"variant": name, "slots": dict(reg.variants[name].slots), "config": get_preset("tiny").to_dict(),
            "seed": 0, "device": device, "dtype": "fp32",
            "plugins": PluginSpec(files=[str(PLUGINS / "evade_scale_on_gpu.py")], strict=True).to_dict()}
    return T.run_trial(TrialSpec.from_dict(spec)).row


def test_an_attention_that_differs_only_on_a_gpu_passes_everything_on_the_cpu():
    """evade_scale_on_gpu divides by d_model on CUDA tensors only: on the CPU it is the paper's attention, so
    check and the CPU gate pass it (the gate runs the device item for GPU trials only; run on the CPU it compares
    two CPU builds and finds nothing); the CUDA test below catches it."""
    reg = _registry("evade_scale_on_gpu")
    assert checks.run_checks(reg, reg.select(["evade_scale_on_gpu"]), device="cpu").failures() == []
    assert G.device_reasons(reg, reg.variants["evade_scale_on_gpu"], get_preset("tiny").model, 0, "cpu") == []
    assert _gpu_trial("evade_scale_on_gpu", "cpu")["status"] == "ok"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_gpu_trial_of_an_attention_that_differs_only_on_a_gpu_is_invalid():
    """On CUDA the gate compares the variant's logits with its CPU build's (harness.checks.gate.device_reasons):
    the GPU-only scale makes its trial invalid, the baseline stays ok, and check --device cuda fails it."""
    row = _gpu_trial("evade_scale_on_gpu", "cuda")
    assert row["status"] == T.INVALID and row["reason"].startswith("device: on cuda"), row["reason"]
    assert _gpu_trial("baseline", "cuda")["status"] == "ok"
    reg = _registry("evade_scale_on_gpu")
    assert checks.run_checks(reg, reg.select(["evade_scale_on_gpu"]), device="cuda").failures() != []
