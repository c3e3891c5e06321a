"""Vectorised trial groups (``run --vectorise-seeds``, :mod:`harness.group`, :mod:`harness.vstep`):
a group's seeds give their sequential trials' results within the documented tolerance
(docs/running.md, "Vectorised seeds"), a non-finite seed is frozen without touching the others,
and a plugin that does not vectorise falls back to sequential trials with one line saying why."""
from __future__ import annotations

import dataclasses
import importlib.util
import math

import pandas as pd
import pytest
import torch

import harness
from harness import group as group_mod
from harness import vectorisable
from harness import train as train_mod
from harness.config import get_preset
from harness.errors import ConfigError
from harness.runmeta import GPU_JOBS, Execution
from harness.store import RunStore
from harness.tasks.base import Batch
from harness.trial import TrialSpec, registry_for
from harness.vstep import FlatRows, GroupStep, StackedAdam, bucket_widths, stack_batches

from .conftest import ROOT

#: The documented tolerance (docs/running.md): relative gap of a seed's held-out CE (and of any
#: training-loss row) between its vectorised and its sequential trial, and the absolute gap of its
#: exact match.
CE_RTOL, EM_ATOL = 1e-2, 0.02
#: Before the trajectories drift apart (the first 10 steps at the tiny preset) the losses differ by float
#: rounding only.
EARLY_RTOL = 1e-5

FALLBACK_PLUGINS = ["vec_item_forward", "vec_data_branch", "vec_no_batching_rule", "vec_buffer_update",
                    "vec_plain_tensor"]


@pytest.fixture(scope="module")
def on_off(tmp_path_factory):
    """``run --variants baseline pre_norm --preset tiny --seeds 4`` with ``--vectorise-seeds on`` and ``off``."""
    tmp = tmp_path_factory.mktemp("vec")
    out = {}
    for mode in ("on", "off"):
        out[mode] = harness.run(variants=["baseline", "pre_norm"], seeds=4, preset="tiny", device="cpu", jobs=1, threads=1,
                                vectorise_seeds=mode, results_dir=tmp, run_id=mode, check=False)
    return out


@pytest.fixture(scope="module")
def adamw_cosine(tmp_path_factory):
    """As :func:`on_off` with AdamW (weight decay 0.1, no decay on biases, norms and embeddings) and the
    cosine schedule (warm-up 10 steps to lr 3e-3, down to 0 at step 20)."""
    tmp = tmp_path_factory.mktemp("vec_adamw")
    recipe = {"train.optimizer": "adamw", "train.weight_decay": 0.1, "train.schedule": "cosine", "train.lr": 3e-3}
    return {mode: harness.run(variants=["baseline", "pre_norm"], seeds=4, preset="tiny", device="cpu", jobs=1,
                              threads=1, vectorise_seeds=mode, results_dir=tmp, run_id=mode, check=False,
                              overrides=recipe)
            for mode in ("on", "off")}


def _trials(folder) -> dict:
    return {(t.row["variant"], t.row["seed"]): t for t in RunStore.open(folder).load_trials()}


@pytest.mark.parametrize("runs", ["on_off", "adamw_cosine"])
def test_vectorised_seeds_equal_their_sequential_trials(runs, request):
    on_off = request.getfixturevalue(runs)
    on, off = _trials(on_off["on"]), _trials(on_off["off"])
    assert on.keys() == off.keys() and len(on) == 8
    for key, v in on.items():
        s = off[key]
        rv, rs = v.row, s.row
        assert rv["vectorised"] == 4 and "vectorised" not in rs, key
        assert rv["status"] == rs["status"] == "ok", key
        assert math.isclose(rv["heldout_ce"], rs["heldout_ce"], rel_tol=CE_RTOL), key
        assert abs(rv["exact_match"] - rs["exact_match"]) <= EM_ATOL, key
        # the dev set's final numbers beside the test set's, equal as the test ones are, and the curve's last row
        assert math.isclose(rv["dev_ce"], rs["dev_ce"], rel_tol=CE_RTOL), key
        assert abs(rv["dev_exact_match"] - rs["dev_exact_match"]) <= EM_ATOL, key
        assert v.curve[-1]["split"] == "dev" and v.curve[-1]["loss"] == rv["dev_ce"] != rv["heldout_ce"], key
        assert [(r["step"], r["split"]) for r in v.curve] == [(r["step"], r["split"]) for r in s.curve]
        for a, b in zip(v.curve, s.curve):
            tol = EARLY_RTOL if a["split"] == "train" and a["step"] <= 10 else CE_RTOL
            assert math.isclose(a["loss"], b["loss"], rel_tol=tol), (key, a, b)
        # honest timing: one group clock, the seed's share of the group's wall time
        assert rv["group_wall_s"] == pytest.approx(4 * rv["wall_s"])
        assert rv["train_s"] == on[(key[0], 0)].row["train_s"]
    # the same trials.csv columns, plus the group's
    cols_on = set(pd.read_csv(on_off["on"] / "trials.csv").columns)
    cols_off = set(pd.read_csv(on_off["off"] / "trials.csv").columns)
    assert cols_on - cols_off == {"vectorised", "group_wall_s", "captured"} and cols_off <= cols_on
    assert {"dev_ce", "dev_exact_match", "dev_token_acc"} <= cols_off


def test_a_groups_phase_clock_counts_each_evaluation_once(on_off):
    """The group's evaluation block wraps each seed's own bookkeeping block of the same phase: the
    inner one must not count again (the H200 main job read 15 evaluation calls for 8 evaluations)."""
    from harness.config import get_preset

    cfg = get_preset("tiny")
    probes = cfg.train.steps // cfg.train.eval_every - 1
    for folder, group in ((on_off["on"], 4), (on_off["off"], 1)):
        for t in RunStore.open(folder).load_trials():
            # the run gate at initialisation once per seed of the clock's trial(s), then the probes
            assert t.phases["evaluate"]["calls"] == group + probes, (folder.name, t.phases)
            # the group's batched final evaluation, then each seed's gate and row
            assert t.phases["final_eval"]["calls"] == (group + 1 if group > 1 else 1), (folder.name, t.phases)


#: aten ops that make the host wait for a GPU (a value read back, or an output whose size depends on
#: the data), and the tensor methods that read a tensor into Python; the CPU runs the same code, so a
#: count here is what a GPU would wait for.
SYNC_OPS = {"_local_scalar_dense", "nonzero", "is_nonzero", "equal", "masked_select", "unique", "_unique2",
            "unique_consecutive", "repeat_interleave"}
READS = ("tolist", "numpy", "cpu")


def test_a_groups_training_steps_wait_for_the_device_once_a_logging_interval(monkeypatch):
    """Issue 27's "one sync per logging interval, not per step": in a group's training, the ``step``
    phase reads nothing back and the ``log`` phase one read per :data:`harness.group.FLUSH_STEPS`
    steps (plus the last). Counted on the CPU, per phase of the group's clock; a ``.item()``, a
    ``bool(tensor)`` or a boolean-mask index in the step would show."""
    from torch.utils._python_dispatch import TorchDispatchMode

    clock = train_mod.PhaseClock()
    monkeypatch.setattr(group_mod, "PhaseClock", lambda: clock)
    seen: dict[str, int] = {}

    def count(what: str) -> None:  # per phase of the group's clock
        phase = clock.current or "(none)"
        seen[phase] = seen.get(phase, 0) + 1

    class Syncs(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket.__name__ in SYNC_OPS:
                count(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    def counted(name: str):
        method = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            count(name)
            return method(self, *args, **kwargs)
        return read

    for name in READS:
        monkeypatch.setattr(torch.Tensor, name, counted(name))
    monkeypatch.setattr(group_mod, "FLUSH_STEPS", 5)  # a short trial with several intervals
    steps = 3 * group_mod.FLUSH_STEPS
    cfg = get_preset("tiny").override({"train.steps": steps, "train.eval_every": 10 * steps})
    specs = [TrialSpec("baseline", s, cfg.to_dict(), device="cpu") for s in (0, 1)]
    with Syncs():
        results = group_mod.run_group(specs)
    assert [r.row["status"] for r in results] == ["ok", "ok"] and all(r.row.get("vectorised") for r in results)
    assert seen.get("step", 0) == 0, seen
    assert 1 <= seen.get("log", 0) <= steps // group_mod.FLUSH_STEPS + 1, seen


def test_the_run_records_how_it_was_executed(on_off):
    assert RunStore.open(on_off["on"]).meta().execution.vectorise_seeds == "on"
    assert RunStore.open(on_off["off"]).meta().execution.vectorise_seeds == "off"


def test_resume_runs_the_missing_seeds_as_a_group(on_off, tmp_path):
    import shutil

    from harness.launch import start_run
    from harness.request import RunRequest

    folder = tmp_path / "on"
    shutil.copytree(on_off["on"], folder)
    for seed in (2, 3):
        (folder / "trials" / f"pre_norm__s{seed}.json").unlink()
    outcome = start_run(RunRequest(resume=str(folder), quiet=True))  # the stored threads (1) and vectorise_seeds
    assert outcome.exit_code == 0 and outcome.meta.execution.vectorise_seeds == "on"
    again = _trials(folder)
    assert len(again) == 8 and [again[("pre_norm", s)].row["vectorised"] for s in (2, 3)] == [2, 2]
    before = _trials(on_off["on"])
    for seed in (2, 3):  # a group of 2 instead of 4: the same trial within the tolerance
        assert math.isclose(again[("pre_norm", seed)].row["heldout_ce"],
                            before[("pre_norm", seed)].row["heldout_ce"], rel_tol=CE_RTOL)


def test_auto_is_on_only_where_it_pays(monkeypatch):
    monkeypatch.setattr("harness.env.available_cores", lambda: 16)
    assert Execution(jobs="auto").resolved(8, "cpu").vectorise_seeds == "off"
    one_group = Execution(jobs="auto").resolved(8, "cuda", n_groups=1)
    assert one_group.vectorise_seeds == "on" and one_group.jobs == 1
    # several groups on one GPU: one worker process per group, at most GPU_JOBS (and one per core)
    assert Execution(jobs="auto").resolved(8, "cuda", n_groups=3).jobs == 3
    assert Execution(jobs="auto").resolved(11, "cuda", n_groups=11).jobs == GPU_JOBS
    monkeypatch.setattr("harness.env.available_cores", lambda: 2)
    assert Execution(jobs="auto").resolved(11, "cuda", n_groups=11).jobs == 2
    assert Execution(jobs=2).resolved(8, "cuda").vectorise_seeds == "on"  # groups in two workers
    assert Execution(jobs=2, vectorise_seeds="off").resolved(8, "cuda").vectorise_seeds == "off"
    assert Execution(jobs="auto", vectorise_seeds="on").resolved(8, "cpu").jobs == 1
    assert Execution(jobs=2, vectorise_seeds="on").validate().jobs == 2
    with pytest.raises(ConfigError, match="local executor"):
        Execution(executor="ray", vectorise_seeds="on").validate()
    with pytest.raises(ConfigError, match="--vectorise-seeds must be one of"):
        Execution(vectorise_seeds="yes").validate()


def test_group_specs_groups_seeds_of_one_variant_and_config():
    cfg = get_preset("tiny")
    planned = [TrialSpec(v, s, cfg.override({"train.steps": p}).to_dict())
               for s in range(5) for v in ("a", "b") for p in (3, 4)]
    groups = group_mod.group_specs(planned, max_size=3)
    assert [[ts.seed for ts in g] for g in groups] == [[0, 1, 2], [3, 4]] * 4
    assert all(len({(ts.variant, ts.config["train"]["steps"]) for ts in g}) == 1 for g in groups)
    measured = [dataclasses.replace(planned[0], seed=s, measure={"kind": "x"}) for s in range(2)]
    assert [len(g) for g in group_mod.group_specs(measured)] == [1, 1]


def test_stacked_adam_with_a_tensor_lr_equals_torch_adam():
    """Row k of the stacked update is torch.optim.Adam on seed k's tensor; a masked row does not move."""
    g = torch.Generator().manual_seed(0)
    rows = [torch.randn(3, 5, generator=g) for _ in range(3)]
    flat = FlatRows({"w": torch.stack(rows), "b": torch.stack(rows)[:, 0]})  # two tensors in one buffer
    mine = flat.views
    adam = StackedAdam(flat)
    ref = [torch.nn.Parameter(r.clone()) for r in rows]
    opts = [torch.optim.Adam([p], lr=1.0, betas=(0.9, 0.98), eps=1e-9, foreach=False) for p in ref]
    mask = torch.tensor([True, True, False])
    for step, lr in enumerate([0.01, 0.02, 0.03, 0.02, 0.01]):
        grads = torch.randn(3, 3, 5, generator=g) * 10.0 ** -step  # shrinking gradients: the eps matters late
        for k, (p, opt) in enumerate(zip(ref, opts)):
            for group in opt.param_groups:
                group["lr"] = lr
            if mask[k]:
                p.grad = grads[k].clone()
                opt.step()
        adam.step(flat.gather({"w": grads, "b": grads[:, 0]}), torch.tensor(lr), mask)
    for k in range(3):
        torch.testing.assert_close(mine["w"][k], ref[k].detach(), rtol=1e-6, atol=1e-7)
    assert adam.t.tolist() == [5.0, 5.0, 0.0]
    assert torch.equal(mine["w"][2], rows[2]) and not adam.m["w"][2].any()
    torch.testing.assert_close(mine["b"], mine["w"][:, 0], rtol=0, atol=0)  # the same update in another view
    assert mine["w"].untyped_storage().data_ptr() == flat.buffers[0].untyped_storage().data_ptr()


def test_stacked_adamw_decays_only_the_decayed_columns_as_torch_adamw():
    """With weight decay, row k of the stacked update is torch.optim.AdamW on seed k's decayed tensor
    and torch.optim.Adam on the others (weight_decay 0: the same tensors bitwise as without decay)."""
    g = torch.Generator().manual_seed(2)
    w, b = torch.randn(2, 3, 5, generator=g), torch.randn(2, 5, generator=g)
    flat, plain = FlatRows({"w": w, "b": b}), FlatRows({"w": w, "b": b})
    adamw, adam = StackedAdam(flat, 0.1, {"w"}), StackedAdam(plain)
    assert [d.tolist() for d in adamw.decay] == [[[1.0] * 15 + [0.0] * 5]] and adam.decay is None
    ref_w = [torch.nn.Parameter(w[k].clone()) for k in range(2)]
    ref_b = [torch.nn.Parameter(b[k].clone()) for k in range(2)]
    opts = [torch.optim.AdamW([{"params": [pw], "weight_decay": 0.1}, {"params": [pb], "weight_decay": 0.0}], lr=1.0,
                              betas=(0.9, 0.98), eps=1e-9, foreach=False) for pw, pb in zip(ref_w, ref_b)]
    mask = torch.tensor([True, True])
    for lr in (0.01, 0.03, 0.02):
        gw, gb = torch.randn(2, 3, 5, generator=g), torch.randn(2, 5, generator=g)
        for k, opt in enumerate(opts):
            for group in opt.param_groups:
                group["lr"] = lr
            ref_w[k].grad, ref_b[k].grad = gw[k].clone(), gb[k].clone()
            opt.step()
        for st, fl in ((adamw, flat), (adam, plain)):
            st.step(fl.gather({"w": gw, "b": gb}), torch.tensor(lr), mask)
    for k in range(2):
        torch.testing.assert_close(flat.views["w"][k], ref_w[k].detach(), rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(flat.views["b"][k], ref_b[k].detach(), rtol=1e-6, atol=1e-7)
    assert torch.equal(flat.views["b"], plain.views["b"])  # an undecayed column: Adam's update, bitwise
    assert not torch.allclose(flat.views["w"], plain.views["w"], rtol=1e-6, atol=1e-7)  # the decay moved w


def test_flat_rows_keep_one_buffer_per_dtype_and_the_norm_spans_them():
    """Parameters of two dtypes: two (K, N) buffers, views that share their storage, gradients
    gathered in the same layout, and a per-seed norm over all of them (clip_grad_norm_'s value)."""
    from harness.vstep import grad_norms

    g = torch.Generator().manual_seed(1)
    tensors = {"w": torch.randn(2, 3, 4, generator=g), "h": torch.randn(2, 5, generator=g).double(),
               "b": torch.randn(2, 4, generator=g)}
    flat = FlatRows(tensors)
    assert [b.shape for b in flat.buffers] == [(2, 16), (2, 5)] and flat.groups == [["w", "b"], ["h"]]
    assert all(torch.equal(flat.views[n], t) and flat.views[n].dtype == t.dtype for n, t in tensors.items())
    flat.buffers[0][1].fill_(7.0)  # writing a buffer is writing its views
    assert (flat.views["w"][1] == 7).all() and (flat.views["b"][1] == 7).all() and torch.equal(flat.views["w"][0], tensors["w"][0])
    grads = {n: torch.randn(t.shape, generator=g).to(t.dtype) for n, t in tensors.items()}
    norms = grad_norms(flat.gather(grads))
    for k in range(2):
        ref = torch.nn.utils.get_total_norm([grads[n][k].float() for n in tensors])
        assert norms[k] == pytest.approx(float(ref), rel=1e-6)
    zeros = flat.zeros_like()
    assert zeros.groups == flat.groups and all(not b.any() for b in zeros.buffers)


def test_stack_batches_pads_to_the_widest_or_to_fixed_widths():
    a = Batch(torch.ones(2, 3, dtype=torch.long), torch.ones(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.long))
    b = Batch(torch.ones(2, 5, dtype=torch.long), torch.ones(2, 2, dtype=torch.long), torch.ones(2, 2, dtype=torch.long))
    src, tgt, tgt_y = stack_batches([a, b])
    assert src.shape == (2, 2, 5) and tgt.shape == tgt_y.shape == (2, 2, 4)
    assert src[0, :, 3:].eq(0).all() and tgt_y[1, :, 2:].eq(0).all() and src[1].eq(1).all()
    assert stack_batches([a, b], widths=(6, 7))[0].shape == (2, 2, 6)
    with pytest.raises(ValueError, match="wider than the fixed"):
        stack_batches([a, b], widths=(4, 7))
    with pytest.raises(ValueError, match="row counts"):
        stack_batches([a, Batch(b.src[:1], b.tgt[:1], b.tgt_y[:1])])


def test_bucket_widths_give_a_few_static_shapes():
    shapes = {bucket_widths(s, t, (20, 21)) for s in range(1, 21) for t in range(1, 22)}
    assert shapes == {(5, 6), (10, 11), (15, 16), (20, 21)}
    assert bucket_widths(10, 11, (20, 21)) == (10, 11) and bucket_widths(11, 2, (20, 21)) == (15, 16)
    with pytest.raises(ValueError, match="wider than"):
        bucket_widths(21, 3, (20, 21))


def test_bench_group_sizes_arms_on_cpu():
    from harness.perf.seeds import run_seed_bench, seed_table

    reg, cfg = registry_for(None), get_preset("tiny")
    rows, info = run_seed_bench(reg.select(["baseline"])[0], cfg, torch.device("cpu"), "fp32", [2], steps=1,
                                warmup=0, registry=reg)
    assert [r["arm"] for r in rows] == ["sequential", "vectorised K=2"]  # no captured arm without CUDA
    assert rows[0]["vs_sequential"] == 1.0 and rows[1]["ms_per_seed_step"] == pytest.approx(rows[1]["step_ms_median"] / 2)
    assert all(0 < r["mfu"] < 1 for r in rows) and info["tokens_per_step"] > 0
    assert list(seed_table(rows).columns)[:3] == ["arm", "dtype", "step ms"]
    # ops / step: the group's norm, clipping and Adam run on flat buffers, a fixed handful of ops, not the
    # ~16 per parameter tensor of a per-tensor optimizer (at K=4: 1,059 ops a step before, 337 now,
    # results/reference/group-step-ops; the sequential step 204: vmap's forward and backward add ~100)
    seq, vec = rows[0]["ops_per_step"], rows[1]["ops_per_step"]
    n_tensors = sum(1 for _ in train_mod.build_model(reg, reg.select(["baseline"])[0], cfg.model).parameters())
    assert 0 < seq and 0 < vec < seq + 8 * n_tensors, (seq, vec, n_tensors)
    assert "ops / step" in seed_table(rows).columns


def test_bench_compiled_arms_step_the_group_like_the_eager_step(monkeypatch):
    """``bench --group-sizes K --compile``: a ``compiled K`` arm (no captured one without CUDA) whose
    step is the group's whole step (gradients, clipping, Adam on the flat buffers) through
    ``torch.compile``: it moves the stacked parameters as the uncompiled step does. Here AOTAutograd
    without code generation (``aot_eager``: it traces ``grad_and_value`` and the in-place Adam as
    Inductor would) to stay fast; Inductor on the CPU: docs/benchmarks.md. A compiled arm whose
    compile fails is dropped with one line; the bench goes on."""
    from harness.perf import bench as B
    from harness.perf.seeds import run_seed_bench

    monkeypatch.setattr(B, "COMPILE_BACKEND", "aot_eager")
    reg, cfg = registry_for(None), get_preset("tiny")
    variant = reg.select(["baseline"])[0]
    models = [train_mod.build_model(reg, variant, cfg.model, seed=s) for s in range(2)]
    eager, compiled = (GroupStep(models, cfg.model.pad, 0.1, 1.0, torch.device("cpu")) for _ in range(2))
    step = B.compile_model(compiled.step, "default")
    task = reg.task(cfg.train.task)
    gens = [torch.Generator().manual_seed(s) for s in range(2)]
    for _ in range(3):
        batch = stack_batches([task.make_batch(cfg.train.batch, cfg.train.seq_len, cfg.model.vocab, g) for g in gens])
        eager.set_lr(1e-3), compiled.set_lr(1e-3)
        (le, ge), (lc, gc) = eager.step(*batch), step(*batch)
        assert torch.allclose(le, lc, rtol=1e-5) and torch.allclose(ge, gc, rtol=1e-4)
    # the same trajectory up to rounding: a weight whose gradient is ~0 (the key bias's is exactly 0) may step
    # either way on rounding alone, up to 2 x lr a step (docs/running.md, "Tolerance"); 94 of 12,214 here
    gaps = torch.cat([(eager.params[n] - compiled.params[n]).abs().flatten() for n in eager.params])
    assert gaps.max() <= 2 * 1e-3 * 3 and (gaps > 1e-5).float().mean() < 0.02, (gaps.max(), (gaps > 1e-5).sum())
    assert (eager.params["embed.generator.weight"][0] - models[0].embed.generator.weight).abs().max() > 1e-3  # it trained (3 steps of lr 1e-3)

    lines = []
    rows, _ = run_seed_bench(variant, cfg, torch.device("cpu"), "fp32", [2], steps=1, warmup=1, registry=reg,
                             log=lines.append, compile_mode="default")
    assert [r["arm"] for r in rows] == ["sequential", "vectorised K=2", "compiled K=2"]
    assert rows[2]["ops_per_step"] is None and 0 < rows[2]["mfu"] < 1

    def broken(fn, mode):
        def call(*a):
            raise RuntimeError("no batching rule for this op")
        return call
    monkeypatch.setattr("harness.perf.seeds.compile_model", broken)
    rows, _ = run_seed_bench(variant, cfg, torch.device("cpu"), "fp32", [2], steps=1, warmup=0, registry=reg,
                             log=lines.append, compile_mode="default")
    assert [r["arm"] for r in rows] == ["sequential", "vectorised K=2"]
    assert "compiled K=2 dropped: RuntimeError: no batching rule for this op" in lines


def test_a_group_steps_through_its_capture_object(monkeypatch):
    """The captured path on the CPU with a stand-in for the CUDA graphs: every step goes through it,
    with batches padded to the task's bucket shapes, and the row counts its shapes."""
    shapes = []

    class FakeCapture:
        def __init__(self, step):
            self.step, self.graphs = step, {}

        def __call__(self, src, tgt, tgt_y):
            self.graphs[(tuple(src.shape), tuple(tgt.shape))] = None
            shapes.append((src.size(-1), tgt.size(-1)))
            return self.step.step(src, tgt, tgt_y)

    monkeypatch.setattr(group_mod, "capture_wanted", lambda device, mode="auto": True)
    monkeypatch.setattr(group_mod, "CapturedStep", FakeCapture)
    cfg = get_preset("tiny").override({"train.steps": 4, "train.eval_every": 2, "train.eval_sequences": 16})
    specs = [TrialSpec("baseline", s, cfg.to_dict(), device="cpu", threads=1) for s in range(2)]
    rows = [r.row for r in group_mod.run_group(specs)]
    assert len(shapes) == 4 and set(shapes) <= {bucket_widths(6, 7, (6, 7), 4)} | {(6, 7)}
    assert [r["captured"] for r in rows] == [1, 1] and [r["status"] for r in rows] == ["ok", "ok"]


def test_capture_is_cuda_only_and_switchable(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert not vectorisable.capture_wanted(cpu) and vectorisable.capture_wanted(cuda)
    monkeypatch.setenv(vectorisable.CAPTURE_ENV, "off")
    assert not vectorisable.capture_wanted(cuda)
    assert vectorisable.capture_wanted(cuda, "on")  # an explicit run --capture wins over the variable
    monkeypatch.setenv(vectorisable.CAPTURE_ENV, "sometimes")
    with pytest.raises(ConfigError, match="auto, on or off"):
        vectorisable.capture_wanted(cuda)
    assert not vectorisable.capture_wanted(cuda, "off") and not vectorisable.capture_wanted(cpu, "on")
    with pytest.raises(ConfigError, match="--capture must be"):
        vectorisable.capture_wanted(cuda, "yes")


def test_run_capture_reaches_the_group_and_the_run_record(monkeypatch, tmp_path):
    """``run --capture off`` (here ``harness.run(capture="off")``): validated, stored in config.json's
    execution, handed to every trial group; ``on`` on the CPU is one ConfigError before anything is stored."""
    seen, real = [], group_mod.run_group

    def spy(specs, *args, capture="auto", **kwargs):
        seen.append(capture)
        return real(specs, *args, capture=capture, **kwargs)

    monkeypatch.setattr(group_mod, "run_group", spy)
    folder = harness.run(variants="baseline", seeds=2, preset="tiny", overrides={"train.steps": 2}, device="cpu",
                         threads=1, vectorise_seeds="on", capture="off", results_dir=tmp_path, run_id="c", check=False)
    assert seen == ["off"] and RunStore.open(folder).meta().execution.capture == "off"
    assert "--capture off" in (folder / "report.md").read_text() or "--capture off" in (folder / "config.json").read_text()
    with pytest.raises(ConfigError, match="--capture on needs a CUDA device"):
        harness.run(variants="baseline", preset="tiny", device="cpu", capture="on", results_dir=tmp_path, run_id="d")
    assert not (tmp_path / "d").exists()


def _models(seeds, variant="baseline"):
    reg, cfg = registry_for(None), get_preset("tiny")
    v = reg.select([variant])[0]
    return [train_mod.build_model(reg, v, cfg.model, seed=s) for s in seeds], cfg


def test_a_seed_is_bitwise_the_same_in_groups_of_2_and_4_on_cpu():
    """Under vmap a seed's trajectory does not depend on how many seeds share its group (on the CPU)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        task, out = registry_for(None).task("copy"), []
        for k in (2, 4):
            models, cfg = _models(range(k))
            g = GroupStep(models, 0, 0.1, 0.0, torch.device("cpu"))
            streams = [task.batches(cfg, torch.Generator().manual_seed(s)) for s in range(k)]
            for step in range(1, 21):
                g.set_lr(0.004 * min(step, 10))
                g.step(*stack_batches([next(s) for s in streams]))
            out.append({n: p[0].clone() for n, p in g.params.items()})
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(out[0][n], out[1][n]) for n in out[0])


def test_a_group_of_one_computes_its_models_own_loss_and_gradients_bitwise():
    """A group of one (the main job's groups) steps without vmap: its loss and gradients are bitwise
    those of the model's own forward and backward, for every variant of 'all'."""
    reg, cfg = registry_for(None), get_preset("tiny")
    task = reg.task("copy")
    batch = next(task.batches(cfg, torch.Generator().manual_seed(0)))
    for variant in reg.select(["all"]):
        model = train_mod.build_model(reg, variant, cfg.model, seed=0)
        step = GroupStep([train_mod.build_model(reg, variant, cfg.model, seed=0)], 0, 0.1, 1.0, torch.device("cpu"))
        grads, loss = step.grad_fn(step.params, step.buffers, *stack_batches([batch]))
        own = train_mod.loss_fn(model(batch.src, batch.tgt), batch.tgt_y, 0, 0.1)
        own.backward()
        assert loss.shape == (1,) and torch.equal(loss[0], own.detach()), variant.name
        for name, p in model.named_parameters():
            assert torch.equal(grads[name][0], p.grad), (variant.name, name)


def test_a_non_finite_seed_is_frozen_and_the_others_step_on():
    """Seed 1 of 3 gets an infinite weight before step 3: its parameters, moments and step count stay
    as they were after step 2; seeds 0 and 2 step as a group without it."""
    models, cfg = _models([0, 1, 2])
    task = registry_for(None).task("copy")
    streams = [task.batches(cfg, torch.Generator().manual_seed(s)) for s in (0, 1, 2)]
    batches = [[next(s) for s in streams] for _ in range(4)]
    three = GroupStep(models, 0, 0.1, 1.0, torch.device("cpu"))
    two = GroupStep([models[0], models[2]], 0, 0.1, 1.0, torch.device("cpu"))
    first = next(iter(three.params))
    for step, rows in enumerate(batches, 1):
        if step == 3:
            three.params[first][1].fill_(float("inf"))
            before = {n: (p[1].clone(), three.adam.m[n][1].clone(), three.adam.v[n][1].clone())
                      for n, p in three.params.items()}
        for g, bs in ((three, rows), (two, [rows[0], rows[2]])):
            g.set_lr(0.01 * step)
            loss, gnorm = g.step(*stack_batches(bs))
    assert not math.isfinite(loss.tolist()[1] if loss.numel() == 3 else float("nan"))
    assert three.active.tolist() == [True, False, True] and three.adam.t.tolist() == [4.0, 2.0, 4.0]
    for n, (p, m, v) in before.items():
        assert torch.equal(three.params[n][1], p) and torch.equal(three.adam.m[n][1], m), n
        assert torch.equal(three.adam.v[n][1], v), n
    for n in three.params:
        torch.testing.assert_close(three.params[n][[0, 2]], two.params[n], rtol=1e-6, atol=1e-7)


def test_a_diverging_seed_ends_as_its_sequential_trial(monkeypatch):
    """A seed whose model is built with a NaN weight diverges at step 1 with the sequential reason,
    alone: the group's other seeds are ok and equal their sequential trials."""
    real = train_mod.build_model

    def poisoned(registry, variant, cfg, seed=0):
        model = real(registry, variant, cfg, seed=seed)
        if seed == 1:
            with torch.no_grad():
                next(model.parameters()).fill_(float("nan"))
        return model

    monkeypatch.setattr(train_mod, "build_model", poisoned)
    monkeypatch.setattr(group_mod, "build_model", poisoned)
    cfg = get_preset("tiny").override({"train.steps": 4, "train.eval_every": 2})
    specs = [TrialSpec("baseline", s, cfg.to_dict(), device="cpu", threads=1) for s in range(3)]
    lines = []
    grouped = group_mod.run_group(specs, log=lines.append)
    alone = [train_mod.run_trial(s) for s in specs]
    assert lines == []  # the probe's first step: seed 1's NaN loss is NaN in both (not a mis-batch)
    assert [r.row["status"] for r in grouped] == [r.row["status"] for r in alone] == ["ok", "invalid", "ok"]
    assert grouped[1].row["reason"] == alone[1].row["reason"]
    assert "non-finite loss at step 1" in grouped[1].row["reason"] and grouped[1].row["steps"] == 1
    for i in (0, 2):
        assert math.isclose(grouped[i].row["heldout_ce"], alone[i].row["heldout_ce"], rel_tol=1e-4)
        assert grouped[i].row["steps"] == 4


def test_a_solved_seed_stops_as_in_its_sequential_trial(monkeypatch):
    """stop_at_solved with the threshold at 0: every seed stops at its first evaluation, as alone."""
    monkeypatch.setattr(train_mod, "SOLVED", 0.0)
    cfg = get_preset("tiny").override({"train.steps": 6, "train.eval_every": 2, "train.stop_at_solved": True})
    specs = [TrialSpec("baseline", s, cfg.to_dict(), device="cpu", threads=1) for s in range(2)]
    grouped, alone = group_mod.run_group(specs), [train_mod.run_trial(s) for s in specs]
    for g, a in zip(grouped, alone):
        assert g.row["steps"] == a.row["steps"] == 2 and g.row["steps_to_solve"] == 2
        assert [r["step"] for r in g.curve] == [r["step"] for r in a.curve]


def _plugin(name):
    path = ROOT / "tests" / "plugins" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_vec_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return path, mod


@pytest.mark.parametrize("name", FALLBACK_PLUGINS)
def test_a_plugin_that_does_not_vectorise_runs_sequentially_with_one_line(name):
    path, mod = _plugin(name)
    plugins = {"modules": [], "files": [str(path)], "strict": False}
    cfg = get_preset("tiny").override({"train.steps": 2, "train.eval_sequences": 16})
    specs = [TrialSpec(name, s, cfg.to_dict(), slots={"layer_norm": name}, device="cpu", plugins=plugins, threads=1)
             for s in range(2)]
    lines = []
    grouped = group_mod.run_group(specs, log=lines.append)
    assert len(lines) == 1 and mod.EXPECT_FALLBACK in lines[0] and "one after another" in lines[0], lines
    alone = [train_mod.run_trial(s) for s in specs]
    for g, a in zip(grouped, alone):
        assert g.row["vectorised"] == 0 and mod.EXPECT_FALLBACK in g.row["vectorised_note"]
        assert g.row["status"] == a.row["status"] and g.row["heldout_ce"] == a.row["heldout_ce"]


@pytest.mark.parametrize("k", [1, 2])
def test_a_group_of_one_evaluates_on_its_own_model(monkeypatch, k):
    """A group of one seed (what a captured single trial on CUDA is) scores and gates its seed with the
    sequential trial's code, not the batched pass over a stack of one; K = 2 still batches."""
    calls = []
    for name in ("evaluate_seeds", "future_leak_seeds"):
        real = getattr(group_mod, name)
        monkeypatch.setattr(group_mod, name, lambda *a, real=real, name=name, **kw: calls.append(name) or real(*a, **kw))
    cfg = get_preset("tiny").override({"train.steps": 4, "train.eval_every": 2, "train.eval_sequences": 16})
    specs = [TrialSpec("baseline", s, cfg.to_dict(), device="cpu", threads=1) for s in range(k)]
    group = group_mod._Group(specs, [None] * k, None)
    assert group.prepare() is None
    grouped = group.train_all(0.0)
    alone = [train_mod.run_trial(s) for s in specs]
    assert (calls == []) == (k == 1), calls
    for g, a in zip(grouped, alone):
        assert g.row["status"] == a.row["status"] == "ok"
        assert math.isclose(g.row["heldout_ce"], a.row["heldout_ce"], rel_tol=1e-4)


def test_groups_in_worker_processes_equal_groups_in_this_process():
    """``--vectorise-seeds on --jobs 2``: each group trains in a worker (one group per worker at a time),
    bitwise as in this process; a group that falls back to sequential trials there says why in one line,
    which reaches the run's log."""
    from harness.executors import pool as executors

    path, mod = _plugin("vec_item_forward")
    plugins = {"modules": [], "files": [str(path)], "strict": False}
    cfg = get_preset("tiny").override({"train.steps": 4, "train.eval_sequences": 16}).to_dict()
    base = [TrialSpec("baseline", s, cfg, device="cpu", threads=1) for s in range(2)]
    odd = [TrialSpec("vec_item_forward", s, cfg, slots={"layer_norm": "vec_item_forward"}, device="cpu",
                     plugins=plugins, threads=1) for s in range(2)]
    got, lines = {}, []
    executors.run_process_pool(base + odd, 2, lambda ts, r: got.__setitem__(ts.key, r), threads=1,
                               vectorise=True, capture="auto", log=lines.append)
    fallback = [ln for ln in lines if not ln.startswith("pool: ")]  # the pool's own line: when its first group began
    assert len(got) == 4 and len(fallback) == 1 and mod.EXPECT_FALLBACK in fallback[0], lines
    assert len(lines) == 2 and lines[-1].startswith("pool: 2 worker process(es); the first trial group began"), lines
    here = group_mod.run_group(base)
    for ts, h in zip(base, here):
        w = got[ts.key].row
        assert w["vectorised"] == 2 and {k: w[k] for k in ("heldout_ce", "exact_match", "final_train_loss")} == \
            {k: h.row[k] for k in ("heldout_ce", "exact_match", "final_train_loss")}
        assert [r["loss"] for r in got[ts.key].curve] == [r["loss"] for r in h.curve]
    assert all(got[ts.key].row["vectorised"] == 0 and got[ts.key].row["status"] == "ok" for ts in odd)


#: The default recipe and AdamW with the cosine schedule (weight decay on a column mask, a decaying lr tensor).
RECIPES = [{}, {"train.optimizer": "adamw", "train.weight_decay": 0.1, "train.schedule": "cosine", "train.lr": 3e-3}]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("recipe", RECIPES)
def test_a_cuda_group_equals_its_sequential_trials(recipe):
    cfg = get_preset("tiny").override({"train.steps": 20, **recipe})
    specs = [TrialSpec("baseline", s, cfg.to_dict(), device="cuda") for s in range(4)]
    grouped, alone = group_mod.run_group(specs), [train_mod.run_trial(s) for s in specs]
    for g, a in zip(grouped, alone):
        assert g.row["vectorised"] == 4 and g.row["device"] == "cuda"
        assert math.isclose(g.row["heldout_ce"], a.row["heldout_ce"], rel_tol=CE_RTOL)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("recipe", RECIPES)
def test_a_captured_group_equals_the_uncaptured_one(monkeypatch, k, recipe):
    """The CUDA-graph step (one graph for the copy task's fixed shapes) gives the eager group's rows;
    a captured group of one (no vmap: the main job's groups) gives its sequential trial's."""
    cfg = get_preset("tiny").override({"train.steps": 30, "train.eval_every": 10, "train.log_every": 5, **recipe})
    specs = [TrialSpec("baseline", s, cfg.to_dict(), device="cuda") for s in range(k)]
    captured = group_mod.run_group(specs)
    monkeypatch.setenv(vectorisable.CAPTURE_ENV, "off")
    eager = group_mod.run_group(specs)  # a group of one without capture: its sequential trial
    for c, e in zip(captured, eager):
        assert c.row["captured"] == 1 and c.row["vectorised"] == k and e.row.get("captured", 0) == 0
        assert c.row["status"] == e.row["status"] == "ok"
        assert math.isclose(c.row["heldout_ce"], e.row["heldout_ce"], rel_tol=CE_RTOL)
        assert [r["step"] for r in c.curve] == [r["step"] for r in e.curve]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_compiled_step_captured_steps_as_the_eager_group():
    """``bench --group-sizes K --compile``'s ``compiled captured`` arm: the group's step through Inductor, then
    captured as a CUDA graph (its warm-up compiles), moves the stacked parameters as the eager step does (the
    rounding-only gaps of docs/running.md, "Tolerance") and leaves its seeds stepping (none masked)."""
    from harness.perf.bench import compile_model
    from harness.vstep import CapturedStep

    reg, cfg = registry_for(None), get_preset("tiny")
    variant, dev = reg.select(["baseline"])[0], torch.device("cuda")
    models = [train_mod.build_model(reg, variant, cfg.model, seed=s).to(dev) for s in range(2)]
    eager, compiled = (GroupStep(models, cfg.model.pad, 0.1, 1.0, dev) for _ in range(2))
    run = CapturedStep(compiled, compile_model(compiled.step, "default"))
    task = reg.task(cfg.train.task)
    gens = [torch.Generator().manual_seed(s) for s in range(2)]
    for _ in range(3):
        batch = [x.to(dev) for x in stack_batches([task.make_batch(cfg.train.batch, cfg.train.seq_len, cfg.model.vocab,
                                                                    g) for g in gens], widths=task.widths(cfg.train.seq_len))]
        eager.set_lr(1e-3), compiled.set_lr(1e-3)
        (le, _), (lc, _) = eager.step(*batch), run(*batch)
        assert torch.allclose(le, lc, rtol=1e-4), (le, lc)
    gaps = torch.cat([(eager.params[n] - compiled.params[n]).abs().flatten() for n in eager.params])
    assert gaps.max() <= 2 * 1e-3 * 3 and (gaps > 1e-4).float().mean() < 0.02
    assert compiled.active.all() and len(run.graphs) == 1


def test_a_quiet_run_keeps_its_log_lines_in_the_run_folder(tmp_path):
    """``run -q`` prints no log lines, yet the run's ``log.txt`` holds its headline, one line per stored
    trial and a fallback's one-line reason (a run on a GPU under ``-q`` lost the reason a group's
    captured step was given up); a resume appends to it."""
    from tests.conftest import cli_in_process

    path, mod = _plugin("vec_item_forward")
    args = ["--plugin", str(path), "run", "--variants", "vec_item_forward", "--preset", "tiny", "--seeds", "2",
            "--set", "train.steps=3", "--set", "train.eval_sequences=16", "--vectorise-seeds", "on", "--device",
            "cpu", "--no-check", "-q", "--results-dir", str(tmp_path)]
    r = cli_in_process(*args, "--run-id", "q")
    assert r.returncode == 0, r.stderr
    assert mod.EXPECT_FALLBACK not in r.stderr and "stored in" not in r.stderr
    lines = (tmp_path / "q" / "log.txt").read_text().splitlines()
    assert sum(mod.EXPECT_FALLBACK in ln for ln in lines) == 1, lines
    assert sum("stored in" in ln for ln in lines) == 2, lines
    (tmp_path / "q" / "trials" / "vec_item_forward__s1.json").unlink()
    r = cli_in_process("run", "--resume", str(tmp_path / "q"), "-q", "--plugin", str(path))
    assert r.returncode == 0, r.stderr
    again = (tmp_path / "q" / "log.txt").read_text().splitlines()
    assert again[:len(lines)] == lines and sum("stored in" in ln for ln in again) == 3, again
