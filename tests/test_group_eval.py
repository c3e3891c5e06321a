"""A trial group's evaluation batched over its seeds (:mod:`harness.tasks.seeds`): every seed's scores
equal its own sequential evaluation (argmax decisions exactly, CE within float rounding: the
tolerance in docs/running.md, "Vectorised seeds"), a module that does not vectorise in eval mode makes
the group evaluate seed by seed with one log line, and a task with its own scoring is not batched."""
from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from harness import group as group_mod
from harness import train as train_mod
from harness.config import get_preset
from harness.env import threads_pinned
from harness.tasks.base import Task
from harness.tasks.seeds import NotBatched, SeedStack, evaluate_seeds
from harness.trial import TrialSpec, registry_for
from harness.vstep import GroupStep, stack_batches

from .conftest import ROOT

#: Relative gap allowed between a seed's batched and sequential held-out CE (float rounding of a
#: vmapped matmul and of decoding batches of other rows; measured 0 on the CPU here).
CE_RTOL = 1e-5
CPU = torch.device("cpu")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread (as each xdist worker has): with two threads on a busy 2-core machine the
    g2p checks below took 3.5 s instead of 0.05 s (small decoding ops)."""
    with threads_pinned(1):
        yield


def _trained_group(task_name: str, k: int, steps: int = 25, device: torch.device = CPU, **train):
    """K tiny baselines of ``task_name`` trained ``steps`` vectorised steps (distinct, non-trivial
    decodings), their GroupStep, task and config."""
    reg = registry_for(None)
    task = reg.task(task_name)
    overrides = {"train.task": task_name, **{f"train.{a}": v for a, v in train.items()}}
    cfg = task.fit(get_preset("tiny").override(overrides), set())
    variant = reg.select(["baseline"])[0]
    models = [train_mod.build_model(reg, variant, cfg.model, seed=s).to(device) for s in range(k)]
    step = GroupStep(models, cfg.model.pad, 0.0, 1.0, device)
    streams = [task.batches(cfg, torch.Generator().manual_seed(s)) for s in range(k)]
    step.set_lr(3e-3)
    for _ in range(steps):
        step.step(*(x.to(device) for x in stack_batches([next(s) for s in streams])))
    return step, models, task, cfg


def _check_equal(step, models, task, cfg, n, seeds=None):
    seeds = list(range(len(models))) if seeds is None else seeds
    stack = SeedStack(models[0], {**step.params, **step.buffers}, cfg.model.pad)
    stack = stack if len(seeds) == len(models) else stack.select(seeds)
    data = task.eval_set(n, cfg.train.seq_len, cfg.model.vocab, cfg.train.eval_seed)
    rows = []
    got = evaluate_seeds(task, stack, data, cfg, CPU, "fp32", progress=rows.append)
    assert sum(rows) == n  # the progress callback saw every row once
    alone = [task.evaluate(step.load(i, models[i]), data, cfg, CPU, "fp32") for i in seeds]
    assert len(got) == len(alone)
    for g, a in zip(got, alone):
        assert g.keys() == a.keys()
        assert math.isclose(g["heldout_ce"], a["heldout_ce"], rel_tol=CE_RTOL), (g, a)
        assert {k: v for k, v in g.items() if k != "heldout_ce"} == {k: v for k, v in a.items() if k != "heldout_ce"}
    assert len({round(a["heldout_ce"], 6) for a in alone}) == len(alone)  # the seeds really differ
    return got, alone


def test_batched_evaluation_of_copy_seeds_equals_each_seed_alone():
    step, models, task, cfg = _trained_group("copy", 3, steps=12)
    _check_equal(step, models, task, cfg, 64)
    _check_equal(step, models, task, cfg, 64, seeds=[2, 0])  # a subset, in its own order


@pytest.fixture(scope="module")
def g2p_group():
    return _trained_group("g2p", 2, steps=12)


@pytest.mark.parametrize("beam", [1, 2])
def test_batched_g2p_decoding_of_seeds_equals_each_seed_alone(g2p_group, beam):
    step, models, task, cfg = g2p_group
    got, alone = _check_equal(step, models, task, cfg.override({"train.beam": beam}), 64)  # 32: greedy PERs tied
    assert {"wer", "per"} <= got[0].keys()
    assert len({a["per"] for a in alone}) > 1  # decodings differ between seeds


def test_a_group_scores_as_with_its_seeds_evaluated_one_by_one(monkeypatch):
    """The same group trained twice, its periodic and final evaluations batched and, with
    ``evaluate_seeds`` refusing, seed by seed: the same curves and final scores."""
    cfg = get_preset("tiny").override({"train.steps": 6, "train.eval_every": 3, "train.eval_sequences": 32})
    specs = [TrialSpec("baseline", s, cfg.to_dict(), device="cpu", threads=1) for s in range(2)]
    batched = group_mod.run_group(specs)

    def refuse(*args, **kwargs):
        raise NotBatched("refused by the test")

    monkeypatch.setattr(group_mod, "evaluate_seeds", refuse)
    lines = []
    one_by_one = group_mod.run_group(specs, log=lines.append)
    assert len(lines) == 1 and "refused by the test" in lines[0]
    for b, o in zip(batched, one_by_one):
        held_b = [r for r in b.curve if r["split"] == "dev"]
        held_o = [r for r in o.curve if r["split"] == "dev"]
        assert [r["step"] for r in held_b] == [r["step"] for r in held_o] == [3, 6]
        for rb, ro in zip(held_b, held_o):
            assert rb["exact_match"] == ro["exact_match"] and math.isclose(rb["loss"], ro["loss"], rel_tol=CE_RTOL)
        for key in ("exact_match", "heldout_token_acc", "status"):
            assert b.row[key] == o.row[key], key
        assert math.isclose(b.row["heldout_ce"], o.row["heldout_ce"], rel_tol=CE_RTOL)
        assert b.phases["final_eval"]["s"] > 0


def test_a_task_with_its_own_evaluate_is_not_batched():
    class OwnScoring(Task):
        name = "own_scoring"

        def evaluate(self, model, data, cfg, device, dtype, chunk=None, causal=False):
            return {"heldout_ce": 0.0, "heldout_token_acc": 1.0, "exact_match": 1.0}

    step, models, _, cfg = _trained_group("copy", 2, steps=0)
    stack = SeedStack(models[0], {**step.params, **step.buffers}, cfg.model.pad)
    with pytest.raises(NotBatched, match="own_scoring"):
        evaluate_seeds(OwnScoring(), stack, None, cfg, CPU, "fp32")


def test_a_group_whose_model_does_not_vectorise_in_eval_mode_evaluates_seed_by_seed():
    path = ROOT / "tests" / "plugins" / "vec_eval_item.py"
    spec_ = importlib.util.spec_from_file_location("_vec_eval_item", path)
    mod = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(mod)
    plugins = {"modules": [], "files": [str(path)], "strict": False}
    cfg = get_preset("tiny").override({"train.steps": 4, "train.eval_every": 2, "train.eval_sequences": 16})
    specs = [TrialSpec(mod.NAME, s, cfg.to_dict(), slots={"layer_norm": mod.NAME}, device="cpu", plugins=plugins,
                       threads=1) for s in range(2)]
    lines = []
    grouped = group_mod.run_group(specs, log=lines.append)
    assert len(lines) == 1 and mod.EXPECT_EVAL_FALLBACK in lines[0], lines
    alone = [train_mod.run_trial(s) for s in specs]
    for g, a in zip(grouped, alone):
        assert g.row["vectorised"] == 2 and g.row["status"] == a.row["status"] == "ok"
        assert math.isclose(g.row["heldout_ce"], a.row["heldout_ce"], rel_tol=1e-4)
        assert [r["step"] for r in g.curve if r["split"] == "dev"] == [2, 4]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("task_name", ["copy", "g2p"])
def test_batched_evaluation_on_cuda_matches_each_seed_alone(task_name):
    """On CUDA the batched kernels are chosen by shape: CE within 1e-4 relative, decisions within 0.02."""
    cuda = torch.device("cuda")
    step, models, task, cfg = _trained_group(task_name, 4, steps=12, device=cuda)
    stack = SeedStack(models[0], {**step.params, **step.buffers}, cfg.model.pad)
    data = task.eval_set(64, cfg.train.seq_len, cfg.model.vocab, cfg.train.eval_seed)
    got = evaluate_seeds(task, stack, data, cfg, cuda, "fp32")
    alone = [task.evaluate(step.load(i, models[i]), data, cfg, cuda, "fp32") for i in range(4)]
    for g, a in zip(got, alone):
        assert math.isclose(g["heldout_ce"], a["heldout_ce"], rel_tol=1e-4), (g, a)
        assert all(abs(g[k] - a[k]) <= 0.02 for k in a if k != "heldout_ce"), (g, a)
    from harness.tasks.seeds import future_leak_seeds

    leak = task.eval_set(64, cfg.train.seq_len, cfg.model.vocab, cfg.train.eval_seed + 1000)
    for future, state, thr in future_leak_seeds(stack, leak, cuda):  # an honest model passes the gate batched
        assert future < thr and state < thr, (future, state, thr)


@pytest.mark.parametrize("name, why", [
    ("evade_memorise", "keeps state between forwards"),
    ("evade_check_stack", "sees the future"),
    ("evade_two_faces", "two builds of the variant"),
])
def test_an_evasive_plugin_trained_as_a_group_is_still_invalid(name, why):
    """The evasive plugins of tests/plugins/ (each built to slip past one check) trained as one
    vectorised group: whatever the group does with them (batched or seed-by-seed evaluation, or the
    sequential fallback), every seed's trial ends ``invalid`` with the reason its sequential trial
    gives; a batched evaluation must not be a way around the future-leak and twin-build gates."""
    path = ROOT / "tests" / "plugins" / f"{name}.py"
    plugins = {"modules": [], "files": [str(path)], "strict": False}
    reg = registry_for(plugins)
    cfg = get_preset("tiny").override({"train.steps": 20, "train.eval_every": 10, "train.eval_sequences": 64})
    specs = [TrialSpec(name, s, cfg.to_dict(), slots=dict(reg.variants[name].slots), device="cpu",
                       plugins=plugins, threads=1) for s in range(2)]
    lines = []
    grouped = group_mod.run_group(specs, log=lines.append)
    assert lines == []  # scores and periodic future-leak checks batched: nothing fell back
    for result in grouped:
        assert result.row.get("vectorised") == 2
        assert result.status == "invalid", (result.status, result.reason)
        assert why in result.reason, result.reason
        if name != "evade_two_faces":  # caught by the periodic check, which the group batches
            assert "at step 10" in result.reason, result.reason


def test_the_batched_future_leak_check_measures_what_each_seed_s_own_check_does():
    """future_leak_seeds on K trained seeds: per seed the gaps of future_leak on its own model (an
    honest model: float rounding, far under the threshold), the same threshold to float rounding."""
    from harness.tasks.base import future_leak
    from harness.tasks.seeds import future_leak_seeds

    step, models, task, cfg = _trained_group("copy", 3, steps=15)
    data = task.eval_set(32, cfg.train.seq_len, cfg.model.vocab, cfg.train.eval_seed + 1000)
    stack = SeedStack(models[0], {**step.params, **step.buffers}, cfg.model.pad)
    batched = future_leak_seeds(stack, data, CPU)
    for i, (future, state, thr) in enumerate(batched):
        step.load(i, models[i])
        f1, s1, t1 = future_leak(models[i], data, cfg.model.pad, CPU)
        assert math.isclose(thr, t1, rel_tol=1e-5)
        assert future < thr and state < thr and f1 < t1 and s1 < t1
        assert abs(future - f1) < 1e-5 and state == 0.0
