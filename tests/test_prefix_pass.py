"""The one-pass prefix logits (CUDA's default, ``HARNESS_PREFIX_PASS=batched`` anywhere; harness/tasks/prefix.py).

It must give the default loop's numbers for every built-in variant, launch far fewer ops, and
leave the future-leak check as sharp as the loop: leaking plugins, and one built to read the
decoder input's width, are caught in both modes.
"""
from __future__ import annotations

from pathlib import Path

import pytest

import torch
from torch import nn

from harness.config import ModelConfig, get_preset
from harness.env import PREFIX_ENV, prefix_pass
from harness.model import build_model
from harness.plugins import PluginSpec
from harness.registry import Registry
from harness.tasks import prefix
from harness.tasks.base import future_leak, prefix_logits

PLUGINS = Path(__file__).parent / "plugins"
CFG = ModelConfig(N=1, d_model=16, h=2, d_ff=32, dropout=0.0, max_len=16, vocab=11)


@pytest.fixture(scope="module")
def data():
    """A quick-preset held-out set of the copy task, 48 rows of real lengths."""
    cfg = get_preset("quick")
    reg = Registry.from_plugins()
    return reg.task(cfg.train.task).eval_set(48, cfg.train.seq_len, CFG.vocab, 5)


def _both(model, b):
    keep = b.tgt_y != CFG.pad
    with torch.inference_mode():
        a = prefix_logits(model.eval(), b.src, b.tgt, keep, CFG.pad)
        c = prefix.prefix_logits_batched(model, b.src, b.tgt, keep, CFG.pad)
    return a, c, keep


def test_batched_prefix_logits_equal_the_loop_for_every_builtin_variant(data, monkeypatch):
    monkeypatch.delenv(PREFIX_ENV, raising=False)
    reg = Registry.from_plugins()
    for v in reg.select(["all", "group:modern"]):
        model = build_model(reg, v, CFG, seed=3)
        a, c, keep = _both(model, data)
        assert (c[~keep] == 0).all(), v.name
        assert torch.allclose(a[keep], c[keep], atol=1e-5, rtol=1e-4), (v.name, float((a[keep] - c[keep]).abs().max()))


def test_the_environment_variable_switches_prefix_logits_and_bad_values_say_what_to_do(data, monkeypatch):
    reg = Registry.from_plugins()
    model = build_model(reg, reg.variants["baseline"], CFG).eval()
    keep = data.tgt_y != CFG.pad
    calls = []
    real = prefix.prefix_logits_batched
    monkeypatch.setattr("harness.tasks.base.prefix_logits_batched", lambda *a: calls.append(1) or real(*a))
    with torch.inference_mode():
        prefix_logits(model, data.src, data.tgt, keep, CFG.pad)
        assert calls == []
        monkeypatch.setenv(PREFIX_ENV, "batched")
        prefix_logits(model, data.src, data.tgt, keep, CFG.pad)
        assert calls == [1]
        monkeypatch.setenv(PREFIX_ENV, "fast")
        with pytest.raises(ValueError, match="HARNESS_PREFIX_PASS must be auto, loop or batched, got 'fast'"):
            prefix_logits(model, data.src, data.tgt, keep, CFG.pad)
    monkeypatch.setenv(PREFIX_ENV, "batched")
    from harness.env import environment

    assert environment(torch.device("cpu"))["prefix_pass"] == "batched"


@pytest.mark.parametrize("value", [None, "auto", " AUTO ", ""])
def test_auto_is_the_batched_pass_on_cuda_and_the_loop_elsewhere(data, monkeypatch, value):
    """The default: launch-bound CUDA gets the one-pass logits, the arithmetic-bound CPU the loop
    (measured: results/reference/gpu-h200-run5); an explicit loop or batched wins on any device."""
    from harness.env import environment

    if value is None:
        monkeypatch.delenv(PREFIX_ENV, raising=False)
    else:
        monkeypatch.setenv(PREFIX_ENV, value)
    assert prefix_pass(torch.device("cuda")) == prefix_pass("cuda:1") == "batched"
    assert prefix_pass(torch.device("cpu")) == prefix_pass(None) == "loop"
    assert environment("cpu")["prefix_pass"] == "loop" and environment("cuda")["prefix_pass"] == "batched"
    reg = Registry.from_plugins()
    model = build_model(reg, reg.variants["baseline"], CFG).eval()
    calls = []
    real = prefix.prefix_logits_batched
    monkeypatch.setattr("harness.tasks.base.prefix_logits_batched", lambda *a: calls.append(1) or real(*a))
    with torch.inference_mode():
        prefix_logits(model, data.src, data.tgt, data.tgt_y != CFG.pad, CFG.pad)  # CPU tensors: the loop
    assert calls == []
    for explicit in ("loop", "batched"):
        monkeypatch.setenv(PREFIX_ENV, explicit)
        assert prefix_pass("cuda") == prefix_pass("cpu") == explicit


def test_the_batched_pass_runs_at_least_4x_fewer_ops(data, monkeypatch):
    """What it is for: on a GPU a small model's evaluation is launch-bound; counted here as
    torch.profiler's CPU events, one per op."""
    from torch.profiler import ProfilerActivity, profile

    monkeypatch.delenv(PREFIX_ENV, raising=False)
    reg = Registry.from_plugins()
    model = build_model(reg, reg.variants["baseline"], CFG).eval()
    keep = data.tgt_y != CFG.pad
    counts = []
    with torch.inference_mode():
        for fn in (prefix_logits, prefix.prefix_logits_batched):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                fn(model, data.src, data.tgt, keep, CFG.pad)
            counts.append(len(prof.events()))
    assert counts[0] >= 4 * counts[1], counts


class _WidthAwareEmbeddings(nn.Module):
    """Adversarial: a target embedding that adds a vector chosen by the decoder input's width
    (``tgt.size(1)``): in training with length buckets the width tells a row about its own
    length. Causal masks cannot stop it. The future-leak check must see it in both prefix modes: the loop's
    prefixes have width t + 1, the batched pass's one column more than the whole pass."""

    def __init__(self, inner, max_len):
        super().__init__()
        self.inner = inner
        self.width_lut = nn.Embedding(max_len + 2, CFG.d_model)
        nn.init.normal_(self.width_lut.weight, std=1.0)

    def src(self, ids):
        return self.inner.src(ids)

    def tgt(self, ids):
        return self.inner.tgt(ids) + self.width_lut.weight[ids.size(1)]

    def logits(self, x):
        return self.inner.logits(x)


@pytest.mark.parametrize("mode", ["loop", "batched"])
@pytest.mark.parametrize("name", ["adv_causal_shift", "adv_length_embedding", "width"])
def test_the_future_leak_check_catches_leaks_in_both_modes(data, monkeypatch, mode, name):
    monkeypatch.setenv(PREFIX_ENV, mode)
    if name == "width":
        reg = Registry.from_plugins()
        model = build_model(reg, reg.variants["baseline"], CFG, seed=1)
        model.embed = _WidthAwareEmbeddings(model.embed, CFG.max_len)
    else:
        reg = Registry.from_plugins(PluginSpec(files=[str(PLUGINS / f"{name}.py")], strict=True))
        model = build_model(reg, reg.variants[name], CFG, seed=1)
    future, state, thr = future_leak(model, data, CFG.pad, "cpu")
    assert future > thr, (name, mode, future, thr)
    reg = Registry.from_plugins()
    clean = build_model(reg, reg.variants["baseline"], CFG, seed=1)
    future, state, thr = future_leak(clean, data, CFG.pad, "cpu")
    assert future <= thr and state <= thr, (mode, future, state, thr)


@pytest.mark.parametrize("name", ["baseline", "rope_positions", "seed_004"])
def test_a_groups_batched_prefix_logits_equal_its_loop_and_each_seeds_own(data, monkeypatch, name):
    """A trial group's prefix logits (K seeds through vmap) in one pass equal the group's loop and
    each seed's own model within the check's tolerance; the future-leak check of the group in batched mode
    passes for these clean models."""
    from harness.tasks.seeds import SeedStack, future_leak_seeds, prefix_logits_seeds
    from harness.vstep import GroupStep

    reg = Registry.from_plugins()
    models = [build_model(reg, reg.variants[name], CFG, seed=s) for s in (0, 1)]
    step = GroupStep(models, CFG.pad, 0.0, 1.0, torch.device("cpu"))
    stack = SeedStack(models[0], {**step.params, **step.buffers}, CFG.pad)
    keep = data.tgt_y != CFG.pad
    with torch.inference_mode():
        monkeypatch.setenv(PREFIX_ENV, "loop")
        loop = prefix_logits_seeds(stack, data.src, data.tgt, keep)
        monkeypatch.setenv(PREFIX_ENV, "batched")
        batched = prefix_logits_seeds(stack, data.src, data.tgt, keep)
        for s, model in enumerate(models):
            own = prefix.prefix_logits_batched(model.eval(), data.src, data.tgt, keep, CFG.pad)
            assert torch.allclose(batched[s][keep], loop[s][keep], atol=1e-5, rtol=1e-4), name
            assert torch.allclose(batched[s][keep], own[keep], atol=1e-5, rtol=1e-4), name
        assert (batched[:, ~keep] == 0).all()
        gaps = future_leak_seeds(stack, data, "cpu")
    assert all(f <= thr and st <= thr for f, st, thr in gaps), gaps


@pytest.mark.parametrize("name", ["adv_causal_shift", "adv_length_embedding"])
def test_a_groups_batched_leak_check_catches_leaking_plugins(data, monkeypatch, name):
    from harness.tasks.seeds import SeedStack, future_leak_seeds
    from harness.vstep import GroupStep

    monkeypatch.setenv(PREFIX_ENV, "batched")
    reg = Registry.from_plugins(PluginSpec(files=[str(PLUGINS / f"{name}.py")], strict=True))
    models = [build_model(reg, reg.variants[name], CFG, seed=s) for s in (0, 1)]
    step = GroupStep(models, CFG.pad, 0.0, 1.0, torch.device("cpu"))
    gaps = future_leak_seeds(SeedStack(models[0], {**step.params, **step.buffers}, CFG.pad), data, "cpu")
    assert all(f > thr for f, _, thr in gaps), gaps


def test_a_pass_over_the_element_budget_runs_in_row_chunks_with_the_same_logits(data, monkeypatch):
    """A one pass larger than PREFIX_ELEMENTS splits its rows over a few forwards (bounded memory on
    a large evaluation) and gives the unsplit pass's logits, for one model and for a group."""
    from harness.tasks.seeds import SeedStack, prefix_logits_seeds
    from harness.vstep import GroupStep

    reg = Registry.from_plugins()
    models = [build_model(reg, reg.variants["baseline"], CFG, seed=s).eval() for s in (0, 1)]
    step = GroupStep(models, CFG.pad, 0.0, 1.0, torch.device("cpu"))
    stack = SeedStack(models[0], {**step.params, **step.buffers}, CFG.pad)
    keep = data.tgt_y != CFG.pad
    monkeypatch.setenv(PREFIX_ENV, "batched")
    with torch.inference_mode():
        whole = prefix.prefix_logits_batched(models[0], data.src, data.tgt, keep, CFG.pad)
        whole_k = prefix_logits_seeds(stack, data.src, data.tgt, keep)
        width = data.tgt.size(1) + 1
        rows = int(keep.sum())
        # a budget of 7 rows a forward (3 for the two seeds)
        monkeypatch.setattr(prefix, "PREFIX_ELEMENTS", 7 * width * max(CFG.d_ff, CFG.d_model, CFG.vocab))
        assert prefix.row_chunk(models[0], width) == 7 and prefix.row_chunk(models[0], width, 2) == 3
        calls = []
        real = type(models[0]).decode
        monkeypatch.setattr(type(models[0]), "decode", lambda self, *a: calls.append(a[2].size(0)) or real(self, *a))
        split = prefix.prefix_logits_batched(models[0], data.src, data.tgt, keep, CFG.pad)
        assert len(calls) == -(-rows // 7) and max(calls) == 7, calls
        monkeypatch.undo()
        monkeypatch.setenv(PREFIX_ENV, "batched")
        monkeypatch.setattr(prefix, "PREFIX_ELEMENTS", 3 * 2 * width * max(CFG.d_ff, CFG.d_model, CFG.vocab))
        seen = []
        real_at = stack.position_logits
        monkeypatch.setattr(stack, "position_logits", lambda m, *a: seen.append(m.size(1)) or real_at(m, *a))
        split_k = prefix_logits_seeds(stack, data.src, data.tgt, keep)
        assert len(seen) == -(-rows // 3) and max(seen) == 3, seen
    assert torch.allclose(split[keep], whole[keep], atol=1e-6, rtol=1e-5) and (split[~keep] == 0).all()
    assert torch.allclose(split_k[:, keep], whole_k[:, keep], atol=1e-6, rtol=1e-5)
    assert prefix.row_chunk(nn.Linear(2, 2), width) is None  # no cfg: no limit


@pytest.mark.parametrize("var, say", [(PREFIX_ENV, "must be auto, loop or batched"),
                                      ("HARNESS_CAPTURE", "must be auto, on or off")])
def test_a_bad_switch_is_bad_input_before_anything_is_stored(tmp_path, monkeypatch, var, say):
    """A mistyped environment switch is one line and exit 2 at the start, not a failed trial per
    seed (it was read only inside the trials)."""
    from .conftest import cli_in_process

    monkeypatch.setenv(var, "bogus")
    for args in (["--variants", "baseline", "--preset", "tiny"], ["--suite"]):  # a suite checks before its folder
        out = cli_in_process("run", *args, "--results-dir", str(tmp_path), "-q")
        assert out.returncode == 2 and say in out.stderr and var in out.stderr, (args, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr
        assert list(tmp_path.iterdir()) == [], args
