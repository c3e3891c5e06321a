"""The training loop's pieces: greedy exact-match with early exit, evaluation, the shared
train step, the optimizer, process settings, per-trial peak memory and time-to-solve accounting."""
from __future__ import annotations

import math
import os
import types

import pandas as pd
import pytest
import torch

from harness import train as T
from harness.checks.properties.trial_rows import integrity_reasons
from harness.config import get_preset
from harness.env import autocast, environment, peak_mem_mb, reset_peak_mem, trial_settings
from harness.model import build_model
from harness.recipe import make_optimizer
from harness.schedule import noam_lambda
from harness.tasks.base import END, PAD, Task, evaluate, future_leak, greedy_exact_match, loss_fn
from harness.tasks.copy import exact_match, greedy_decode

from .conftest import builtin_variant_names
from .tasks_by_name import eval_set, make_batch


class ScriptedCopier:
    """A stand-in model with the assembler's decoding interface whose answers are scripted:
    row r copies its source, except rows with r % 3 == 0, which emit a wrong token at label
    position r % 4. It records how many rows every decoder call received."""

    def __init__(self, vocab: int = 11):
        from variants.mask import BoolMask

        self.cfg = types.SimpleNamespace(pad=PAD)
        self.mask_style = BoolMask()
        self.vocab = vocab
        self.embed = types.SimpleNamespace(logits=lambda states: states)  # states are logits already
        self.decoded_rows = 0

    def encode(self, src, src_mask):
        rows = torch.arange(src.size(0), dtype=torch.float32)[:, None].expand_as(src)
        return torch.stack([src.float(), rows], dim=-1)  # (B, S, 2): token, row id

    def decode(self, memory, src_mask, ys, tgt_mask):
        self.decoded_rows += ys.size(0)
        t = ys.size(1) - 1  # label position being predicted
        src, rows = memory[..., 0].long(), memory[:, 0, 1].long()  # (B, S), (B,)
        want = src[:, t] if t < src.size(1) else torch.full_like(rows, PAD)
        want = torch.where(want == PAD, torch.full_like(want, END), want)  # end symbol after the content
        wrong = (rows % 3 == 0) & (rows % 4 == t)
        pred = torch.where(wrong, (want + 1 - 3) % (self.vocab - 3) + 3, want)
        states = torch.full((ys.size(0), ys.size(1), self.vocab), -1.0)
        states[:, -1] = torch.nn.functional.one_hot(pred, self.vocab).float()
        return states  # (B, t+1, V)


def test_greedy_exact_match_decides_like_greedy_decode_with_fewer_rows():
    data = eval_set("copy", 60, 8, 11, seed=5)
    reference = ScriptedCopier()
    expected = exact_match(greedy_decode(reference, data.src, data.tgt_y.size(1)), data.tgt_y)
    fast = ScriptedCopier()
    got = greedy_exact_match(fast, data.src, data.tgt_y, PAD)
    assert torch.equal(got, expected)
    assert 0 < int(got.sum()) < len(got)  # both outcomes occur
    last = [int((row != PAD).nonzero().max()) for row in data.tgt_y]  # last label position
    decided = [min(r % 4, n) if r % 3 == 0 else n for r, n in enumerate(last)]
    assert fast.decoded_rows == sum(d + 1 for d in decided)  # each row decoded until decided
    assert reference.decoded_rows == len(last) * data.tgt_y.size(1)


@pytest.mark.parametrize("name", ["baseline", "seed_001", "seed_003"])
def test_evaluate_matches_forward_and_greedy_decode(registry, name):
    cfg = get_preset("tiny")
    model = build_model(registry, registry.variants[name], cfg.model, seed=0)
    T.train(model, cfg, seed=0, device=torch.device("cpu"))  # a partly trained model
    data = eval_set(cfg.train.task, 50, cfg.train.seq_len, cfg.model.vocab, seed=7)
    got = evaluate(model, data, cfg, torch.device("cpu"), "fp32", chunk=16)
    model.eval()
    with torch.no_grad():
        logits = model(data.src, data.tgt)
        em = exact_match(greedy_decode(model, data.src, data.tgt_y.size(1)), data.tgt_y).float().mean()
    assert got["heldout_ce"] == pytest.approx(float(loss_fn(logits, data.tgt_y, PAD, 0.0)), rel=1e-5)
    assert got["exact_match"] == pytest.approx(float(em))


@pytest.mark.parametrize("name", builtin_variant_names())
def test_every_builtin_variant_passes_the_integrity_gate(registry, name):
    cfg = get_preset("quick")
    model = build_model(registry, registry.variants[name], cfg.model, seed=0)
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    assert integrity_reasons(model, cfg.model, torch.device("cpu")) == []
    assert model.training  # the gate restores the mode ...
    assert torch.equal(torch.get_rng_state(), rng)  # ... the trial's RNG stream ...
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # ... and the weights


@pytest.mark.parametrize("name,fault", [("bug_001_discarded_mask", "sees the future"),
                                        ("bug_001_uint8_invert", "sees the future"),
                                        ("bug_001_unexpanded_mask", "probes crash")])
def test_decoders_that_see_the_future_or_crash_fail_the_gate(registry, name, fault):
    cfg = get_preset("quick")
    model = build_model(registry, registry.variants[name], cfg.model, seed=0)
    reasons = integrity_reasons(model, cfg.model, torch.device("cpu"))
    assert reasons and fault in reasons[0]


@pytest.mark.parametrize("name", ["baseline", "seed_001", "seed_002"])
def test_prefix_only_scores_equal_teacher_forcing_and_greedy_on_a_half_trained_model(registry, name):
    """For a causal decoder the prefix-only scores are the teacher-forced CE and greedy decoding's
    exact match, on a model half-way through learning (both exact-match outcomes occur)."""
    cfg = get_preset("quick").override({"train.steps": 150, "train.eval_every": 0})
    model = build_model(registry, registry.variants[name], cfg.model, seed=0)
    T.train(model, cfg, seed=0, device=torch.device("cpu"))
    data = eval_set(cfg.train.task, 400, cfg.train.seq_len, cfg.model.vocab, seed=9)
    got = evaluate(model, data, cfg, torch.device("cpu"), "fp32")
    model.eval()
    with torch.no_grad():
        greedy = greedy_exact_match(model, data.src, data.tgt_y, PAD).float().mean()
        forced_ce = loss_fn(model(data.src, data.tgt), data.tgt_y, PAD, 0.0)
    assert 0.05 < got["exact_match"] < 0.95  # both outcomes occur, so the test can fail
    assert got["exact_match"] == pytest.approx(float(greedy))
    assert got["heldout_ce"] == pytest.approx(float(forced_ce), rel=1e-5)


def test_a_leaky_decoder_is_invalid_and_scored_without_the_future(registry):
    cfg = get_preset("tiny")
    model = build_model(registry, registry.variants["bug_001_discarded_mask"], cfg.model, seed=0)
    metrics, _ = T.train(model, cfg, seed=0, device=torch.device("cpu"))
    assert metrics["exact_match_method"] == T.EM_PREFIX
    assert metrics["status"] == T.INVALID and "at initialisation" in metrics["reason"]
    assert "differ from the prefix-only logits" in metrics["reason"]  # the evaluation's own check too
    assert metrics["steps"] == cfg.train.steps  # it still trained: its numbers are visible
    model = build_model(registry, registry.variants["baseline"], cfg.model, seed=0)
    metrics, _ = T.train(model, cfg, seed=0, device=torch.device("cpu"))
    assert metrics["exact_match_method"] == T.EM_PREFIX and metrics["status"] == "ok"


def test_train_step_skips_the_update_when_the_loss_is_not_finite(registry):
    cfg = get_preset("tiny")
    model = build_model(registry, registry.variants["baseline"], cfg.model, seed=0)
    opt, sched = make_optimizer(model, cfg)
    with torch.no_grad():
        model.embed.generator.bias[0] = float("nan")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    batch = make_batch(cfg.train.task, 4, cfg.train.seq_len, cfg.model.vocab, torch.Generator().manual_seed(0))
    loss, _ = T.train_step(model, batch, opt, sched, cfg, torch.device("cpu"))
    assert math.isnan(loss)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]) or torch.isnan(v).any(), k
    assert sched.last_epoch == 0


def test_train_step_phases_and_optimizer(registry):
    cfg = get_preset("tiny")
    model = build_model(registry, registry.variants["baseline"], cfg.model, seed=0)
    opt, sched = make_optimizer(model, cfg)
    assert opt.defaults["fused"] is True and opt.defaults["betas"] == (0.9, 0.98) and opt.defaults["eps"] == 1e-9
    assert opt.param_groups[0]["lr"] == pytest.approx(cfg.train.noam_factor
                                                      * noam_lambda(cfg.model.d_model, cfg.train.warmup)(0))
    phases = []
    batch = make_batch(cfg.train.task, 4, cfg.train.seq_len, cfg.model.vocab, torch.Generator().manual_seed(0))
    w = model.embed.generator.weight.detach().clone()
    loss, gnorm = T.train_step(model, batch, opt, sched, cfg, torch.device("cpu"), clock=phases.append)
    assert phases == ["forward", "backward", "optimizer"]
    assert math.isfinite(loss) and gnorm > 0 and sched.last_epoch == 1
    assert not torch.equal(w, model.embed.generator.weight)


@pytest.mark.parametrize("name", builtin_variant_names())
def test_bf16_autocast_runs_matmuls_in_bf16_and_the_loss_in_fp32(registry, name):
    cfg = get_preset("tiny")
    model = build_model(registry, registry.variants[name], cfg.model, seed=0)
    seen = []
    hooks = [m.register_forward_hook(lambda mod, inp, out: seen.append(out.dtype))
             for m in model.modules() if isinstance(m, torch.nn.Linear)]
    batch = make_batch(cfg.train.task, 8, cfg.train.seq_len, cfg.model.vocab, torch.Generator().manual_seed(0))
    with autocast(torch.device("cpu"), "bf16"):
        logits = model(batch.src, batch.tgt)
    for h in hooks:
        h.remove()
    loss = loss_fn(logits, batch.tgt_y, PAD, 0.1)
    assert seen and set(seen) == {torch.bfloat16}
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is None or p.grad.dtype == torch.float32 for p in model.parameters())


@pytest.fixture
def restore_settings():
    import torch.utils.deterministic as det

    import harness.env as env_mod

    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             det.fill_uninitialized_memory)
    saved_flag = env_mod._SETTINGS_APPLIED
    yield
    torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
    det.fill_uninitialized_memory = saved[2]
    torch.set_flush_denormal(False)
    env_mod._SETTINGS_APPLIED = saved_flag


def test_trial_settings(restore_settings):
    import torch.utils.deterministic as det

    trial_settings()
    assert torch.are_deterministic_algorithms_enabled() and not det.fill_uninitialized_memory
    if torch.set_flush_denormal(True):  # the CPU supports it
        assert float(torch.tensor([1e-40]) * 1.0) == 0.0
    env = environment()
    assert "flush_denormal" in env["trial_settings"] and env["cpu_capability"]


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
def test_peak_memory_window_resets():
    cpu = torch.device("cpu")
    reset_peak_mem(cpu)
    base = peak_mem_mb(cpu)
    big = torch.ones(64 * 2**20 // 4)  # 64 MiB touched
    high = peak_mem_mb(cpu)
    del big
    reset_peak_mem(cpu)
    assert high - base > 50
    assert peak_mem_mb(cpu) < high - 50


def test_time_to_solve_counts_training_time_only(registry, monkeypatch):
    """A fake clock: every train step takes 1 s, every evaluation 100 s; the model 'solves'
    at the second periodic evaluation. time_to_solve_s must be exactly the steps' time."""
    cfg = get_preset("tiny").override({"train.steps": 12, "train.eval_every": 3})
    clock = [0.0]
    evals = []
    monkeypatch.setattr(T, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    real_step = T.train_step

    def step(*args, **kwargs):
        clock[0] += 1.0
        return real_step(*args, **kwargs)

    def evaluate(*args, **kwargs):
        clock[0] += 100.0
        evals.append(1)
        return {"heldout_ce": 0.1, "heldout_token_acc": 1.0, "exact_match": 1.0 if len(evals) >= 2 else 0.5}

    monkeypatch.setattr(T, "train_step", step)
    monkeypatch.setattr(Task, "evaluate", evaluate)  # the scoring train() calls: the task's
    model = build_model(registry, registry.variants["baseline"], cfg.model, seed=0)
    metrics, curve = T.train(model, cfg, seed=0, device=torch.device("cpu"))
    assert metrics["steps_to_solve"] == 6 and metrics["time_to_solve_s"] == 6.0
    assert metrics["train_s"] == 12.0 and len(evals) == 5  # 3 periodic + the final dev and test evaluations
    assert [c["wall_s"] for c in curve if c["split"] == "dev"] == [3.0, 6.0, 9.0, 12.0]


def test_a_leaky_decoder_is_scored_on_prefix_only_forwards(registry):
    """The held-out scores of a decoder that sees the future are what it predicts without it: equal
    to CE computed from truncated targets (an independent construction: ``model(src, tgt[:, :t+1])``,
    last position), and far from the teacher-forced CE the leak would have bought."""
    cfg = get_preset("quick").override({"train.steps": 100, "train.eval_every": 0})
    model = build_model(registry, registry.variants["bug_001_discarded_mask"], cfg.model, seed=0)
    T.train(model, cfg, seed=0, device=torch.device("cpu"))
    data = eval_set(cfg.train.task, 64, cfg.train.seq_len, cfg.model.vocab, seed=3)
    got = evaluate(model, data, cfg, torch.device("cpu"), "fp32", chunk=16)
    model.eval()
    with torch.no_grad():
        cut = torch.stack([model(data.src, data.tgt[:, :t + 1])[:, -1] for t in range(data.tgt.size(1))], 1)
        leaky = float(loss_fn(model(data.src, data.tgt), data.tgt_y, PAD, 0.0))
    assert got["heldout_ce"] == pytest.approx(float(loss_fn(cut, data.tgt_y, PAD, 0.0)), rel=1e-5)
    assert leaky < 0.7 * got["heldout_ce"]  # the leak is real and large (0.88 vs 1.76): the test can fail
    gap, state, thr = future_leak(model, data, PAD, torch.device("cpu"))
    assert gap > 100 * thr and state <= thr


def test_a_record_stored_with_the_old_name_lr_reads_it_as_the_noam_factor_and_keeps_its_hash():
    """``TrainConfig.noam_factor`` was stored as ``lr`` before it was renamed (it is the Noam schedule's
    factor, not a learning rate). A stored record of that time (every train key of then, ``lr`` among
    them, no ``noam_factor``) still reads ``lr`` as the factor and keeps its config hash (so it can be
    resumed); ``train.lr`` given today is the peak learning rate, refused with the noam schedule."""
    from harness.config import RunConfig
    from harness.errors import ConfigError
    from harness.store import config_hash

    new = get_preset("quick")
    old = new.to_dict()
    old["train"]["lr"] = old["train"].pop("noam_factor")
    assert RunConfig.from_dict(old) == new and new.train.noam_factor == 0.15 and new.train.lr is None
    assert config_hash(old) == config_hash(new.to_dict()) == "df61d0adfdf1"  # results/reference/main-job
    assert new.override({"train.noam_factor": 0.3}).train.noam_factor == 0.3
    with pytest.raises(ConfigError, match="train.lr=0.3 is a peak learning rate, which the noam schedule"):
        new.override({"train.lr": 0.3})
    partial = {"train": {"lr": 0.3}}  # not a whole stored record: today's meaning, so refused with noam
    with pytest.raises(ConfigError, match="noam schedule does not take"):
        RunConfig.from_dict(partial)
    cosine = new.override({"train.schedule": "cosine", "train.lr": 0.003})
    assert cosine.train.lr == 0.003 and cosine.train.noam_factor == 0.15
    assert RunConfig.from_dict(cosine.to_dict()) == cosine  # lr and noam_factor both stored: today's record
    assert config_hash(cosine.to_dict()) != config_hash(new.override({"train.schedule": "cosine"}).to_dict())


@pytest.mark.parametrize("steps", [25, 8])
def test_step_time_and_tokens_per_s_leave_out_the_warm_up_steps(registry, monkeypatch, steps):
    """A fake clock: the first WARMUP_STEPS steps take 10 s each, later ones 1 s, an evaluation 100 s.
    step_ms and tokens_per_s must time only the steps after the warm-up (train_s keeps them all);
    a trial no longer than the warm-up times every step."""
    cfg = get_preset("tiny").override({"train.steps": steps, "train.eval_every": 5})
    clock, tokens = [0.0], []
    monkeypatch.setattr(T, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    real_step = T.train_step

    def step(model, batch, *args, **kwargs):
        clock[0] += 10.0 if len(tokens) < T.WARMUP_STEPS else 1.0
        tokens.append(batch.ntokens)
        return real_step(model, batch, *args, **kwargs)

    def evaluate(*args, **kwargs):
        clock[0] += 100.0
        return {"heldout_ce": 0.1, "heldout_token_acc": 1.0, "exact_match": 0.5}

    monkeypatch.setattr(T, "train_step", step)
    monkeypatch.setattr(Task, "evaluate", evaluate)
    model = build_model(registry, registry.variants["baseline"], cfg.model, seed=0)
    metrics, _ = T.train(model, cfg, seed=0, device=torch.device("cpu"))
    assert T.WARMUP_STEPS == 10 and len(tokens) == steps
    if steps > T.WARMUP_STEPS:
        assert metrics["train_s"] == 10.0 * T.WARMUP_STEPS + steps - T.WARMUP_STEPS  # every step, evaluations out
        assert metrics["step_ms"] == 1000.0  # with the warm-up counted: 115 s / 25 steps = 4600 ms
        assert metrics["tokens_per_s"] == pytest.approx(sum(tokens[T.WARMUP_STEPS:]) / (steps - T.WARMUP_STEPS))
    else:
        assert metrics["train_s"] == 10.0 * steps and metrics["step_ms"] == 10_000.0
        assert metrics["tokens_per_s"] == pytest.approx(sum(tokens) / (10.0 * steps))
    from harness.report import aggregate  # the report's step ms is the trial's

    row = {"variant": "baseline", "point": "", "seed": 0, "params": 1, **metrics}
    assert aggregate(pd.DataFrame([row]))[0].step_ms == metrics["step_ms"]


def test_log_every_averages_the_training_loss_into_fewer_rows_and_changes_no_metric(registry, monkeypatch):
    """``train.log_every=5`` over 12 steps: train rows at steps 5, 10 and 12, each the mean of the per-step
    losses of an identical ``log_every=1`` trial; every score and ``final_train_loss`` are the same, and
    the default keeps the config hash (results/reference/main-job). Every evaluation closes a row, so a
    trial stopped early (solved at an evaluation between two rows) has its last steps' row before that
    evaluation's row."""
    from harness.store import config_hash

    cfg = get_preset("tiny").override({"train.steps": 12, "train.eval_every": 5})
    runs = {}
    for k in (1, 5):
        model = build_model(registry, registry.variants["baseline"], cfg.model, seed=0)
        runs[k] = T.train(model, cfg.override({"train.log_every": k}), seed=0, device=torch.device("cpu"))
    every = [r["loss"] for r in runs[1][1] if r["split"] == "train"]
    rows = [(r["step"], r["loss"]) for r in runs[5][1] if r["split"] == "train"]
    assert len(every) == 12 and [s for s, _ in rows] == [5, 10, 12]
    for (step, loss), lo in zip(rows, (0, 5, 10)):
        assert loss == pytest.approx(sum(every[lo:step]) / (step - lo), rel=1e-6)
    held = [[(r["step"], r["loss"], r["exact_match"]) for r in runs[k][1] if r["split"] == "dev"] for k in (1, 5)]
    assert held[0] == held[1] and len(held[0]) == 3  # evaluations at 5, 10 and the final one
    timing = {"train_s", "step_ms", "tokens_per_s", "time_to_solve_s"}
    a, b = ({k: v for k, v in runs[n][0].items() if k not in timing} for n in (1, 5))
    assert a.keys() == b.keys() and all(a[k] == b[k] or (a[k] != a[k] and b[k] != b[k]) for k in a)
    assert config_hash(get_preset("quick").to_dict()) == "df61d0adfdf1"
    assert config_hash(get_preset("quick").override({"train.log_every": 5}).to_dict()) != "df61d0adfdf1"

    def evaluate(*args, **kwargs):
        return {"heldout_ce": 0.1, "heldout_token_acc": 1.0, "exact_match": 1.0}

    monkeypatch.setattr(Task, "evaluate", evaluate)
    solved = cfg.override({"train.log_every": 4, "train.eval_every": 6, "train.stop_at_solved": True})
    model = build_model(registry, registry.variants["baseline"], cfg.model, seed=0)
    metrics, curve = T.train(model, solved, seed=0, device=torch.device("cpu"))
    assert metrics["steps"] == 6
    assert [(r["step"], r["split"]) for r in curve] == [(4, "train"), (6, "train"), (6, "dev"), (6, "dev")]
