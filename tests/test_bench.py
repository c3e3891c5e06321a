"""``harness bench``: the nn.Transformer reference, FLOP counting, the interleaved timing loop,
the fresh-process peak-memory measurement and the CLI end to end (tiny config, a few steps)."""
from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import torch

from harness.perf import bench as B
from harness.perf.flops import count_flops
from harness.commands.bench import render_markdown
from harness.config import get_preset
from harness.model import build_model
from harness.runmeta import RunMeta

from .conftest import cli_in_process, padded_batch
from .tasks_by_name import make_batch

ROOT = Path(__file__).resolve().parents[1]


def tiny():
    return get_preset("tiny")


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_reference_shapes_gradients_and_causality():
    cfg = tiny().model
    model = B.TorchTransformer(cfg)
    src, tgt = padded_batch(vocab=cfg.vocab, s=6, t=7)
    logits = model(src, tgt)
    assert logits.shape == (src.size(0), tgt.size(1), cfg.vocab) and torch.isfinite(logits).all()
    logits.logsumexp(-1).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    model.eval()
    changed = tgt.clone()
    changed[:, 4:] = (changed[:, 4:] % (cfg.vocab - 3)) + 3
    with torch.no_grad():
        a, b = model(src, tgt), model(src, changed)
    torch.testing.assert_close(a[:, :4], b[:, :4])  # future target tokens never reach earlier positions
    assert not torch.allclose(a[:, 4:], b[:, 4:])


def _analytic_flops(model, batch) -> int:
    """3 x forward matmul FLOPs: every nn.Linear (2 n d_in d_out) plus attention's two
    matmuls per module (2 x 2 B Tq Tk D), from forward hooks on the modules."""
    total = [0]

    def linear(mod, inp, out):
        total[0] += 2 * inp[0].numel() // inp[0].size(-1) * mod.in_features * mod.out_features

    def attention(mod, inp, out):
        q, k = inp[0], inp[1]
        total[0] += 2 * 2 * q.size(0) * q.size(1) * k.size(1) * q.size(2)

    hooks = [m.register_forward_hook(linear) for m in model.modules() if isinstance(m, torch.nn.Linear)]
    hooks += [m.register_forward_hook(attention) for n, m in model.named_modules()
              if n.endswith(("self_attn", "src_attn"))]
    with torch.no_grad():
        model(batch.src, batch.tgt)
    for h in hooks:
        h.remove()
    return 3 * total[0]


@pytest.mark.parametrize("name", ["baseline", "d2l_attention", "torch_attention", "seed_002"])
def test_count_flops_equals_the_matmul_arithmetic(registry, name):
    cfg = tiny()
    model = build_model(registry, registry.variants[name], cfg.model, seed=0)
    batch = make_batch(cfg.train.task, 8, cfg.train.seq_len, cfg.model.vocab, torch.Generator().manual_seed(0))
    assert count_flops(model, batch, cfg, torch.device("cpu"), "fp32") == _analytic_flops(model, batch)
    assert all(p.grad is None for p in model.parameters())


def test_reference_and_baseline_count_the_same_flops(registry):
    cfg = tiny()
    batch = make_batch(cfg.train.task, 8, cfg.train.seq_len, cfg.model.vocab, torch.Generator().manual_seed(0))
    base = build_model(registry, registry.variants["baseline"], cfg.model, seed=0)
    ref = B.TorchTransformer(cfg.model)
    cpu = torch.device("cpu")
    assert count_flops(ref, batch, cfg, cpu, "fp32") == count_flops(base, batch, cfg, cpu, "fp32")


@pytest.mark.parametrize("dtypes", [["fp32"], ["bf16"]])
def test_run_bench_rows(registry, dtypes, monkeypatch):
    # a 128 x 128 peak matmul instead of 2048: a CPU without native bf16 takes ~25 s per
    # 2048^3 bf16 matmul, and the rows' arithmetic does not depend on n
    monkeypatch.setitem(B.PEAK_N, "cpu", 128)
    cfg = tiny()
    variants = [registry.variants["baseline"], registry.variants["pre_norm"]]
    lines = []
    rows, info = B.run_bench(variants, cfg, torch.device("cpu"), dtypes, steps=2, warmup=1, registry=registry,
                             memory=False, log=lines.append)
    got = [(r["contender"], r["dtype"]) for r in rows]
    expect = [(n, d) for n in (B.REFERENCE, "baseline", "pre_norm") for d in dtypes]
    if "fp32" not in dtypes:
        expect.insert(0, (B.REFERENCE, "fp32"))
    assert got == expect
    ref = next(r for r in rows if r["contender"] == B.REFERENCE and r["dtype"] == "fp32")
    assert ref["vs_reference_fp32"] == 1.0 and ref["kind"] == "reference"
    for r in rows:
        assert r["steps_timed"] == 2 and r["gflop_per_step"] > 0 and r["params"] > 0
        assert r["step_ms_min"] <= r["step_ms_median"] and r["step_ms_p25"] <= r["step_ms_p75"]
        assert r["tokens_per_s"] == pytest.approx(info["tokens_per_step"] / r["step_ms_median"] * 1e3)
        assert r["mfu"] == pytest.approx(r["achieved_gflop_per_s"] / info["peak_gflop_per_s"][r["dtype"]])
        assert math.isnan(r["peak_rss_mb"])  # memory=False
    assert set(info["peak_gflop_per_s"]) == {"fp32", *dtypes} and info["peak_n"] == 128
    assert sum("round" in line for line in lines) == 3
    md = render_markdown(rows, info, RunMeta.from_dict({"command": "python -m harness bench", "preset": "tiny",
                                                        "config": cfg.to_dict(), "steps": 2, "warmup_steps": 1,
                                                        "environment": {"torch": torch.__version__}}))
    assert "x nn.Transformer fp32" in md and "MFU" in md


def test_run_bench_rejects_bad_options(registry):
    with pytest.raises(B.BenchError, match="--steps"):
        B.run_bench([], tiny(), torch.device("cpu"), ["fp32"], steps=0, warmup=1, registry=registry)
    with pytest.raises(B.BenchError, match="dtype"):
        B.run_bench([], tiny(), torch.device("cpu"), ["fp16"], steps=1, warmup=0, registry=registry)


def test_peak_memory_is_measured_in_a_fresh_process():
    mem = B.measure_peak_memory("baseline", {}, tiny(), "cpu", "fp32", None, steps=1)
    assert mem["peak_rss_mb"] > mem["base_rss_mb"] > 50  # torch alone is well over 50 MiB
    ref = B.measure_peak_memory(B.REFERENCE, {}, tiny(), "cpu", "fp32", None, steps=1)
    assert ref["peak_rss_mb"] > 0


def _cli(*args: str) -> subprocess.CompletedProcess:
    return cli_in_process(*args, cwd=ROOT)


def test_cli_bench_writes_csv_and_markdown(tmp_path):
    out = _cli("bench", "--variants", "baseline", "--preset", "tiny", "--steps", "2", "--warmup-steps", "0",
               "--no-memory", "--results-dir", str(tmp_path), "--run-id", "b", "-q")
    assert out.returncode == 0, out.stderr
    df = pd.read_csv(tmp_path / "b" / "bench.csv")
    assert list(df["contender"]) == [B.REFERENCE, "baseline"]
    md = (tmp_path / "b" / "bench.md").read_text()
    assert "python -m harness bench --variants baseline --preset tiny" in md.splitlines()[3]
    assert "## Environment" in md and "cpu_flags" in md
    assert "baseline" in out.stdout and "matmul throughput fp32" in out.stdout
    table = [line for line in out.stdout.splitlines() if line.startswith("|")]
    assert max(map(len, table)) <= 120 and "more column(s): bench.md)" in out.stdout  # the terminal's table
    assert "fwd ms" in md and "MFU" in table[0] and "fwd ms" not in table[0]  # bench.md keeps them all


def test_cli_bench_bad_input_is_one_line(tmp_path):
    out = _cli("bench", "--variants", "baseline", "--preset", "tiny", "--steps", "0", "--results-dir", str(tmp_path))
    assert out.returncode == 2 and out.stderr.startswith("harness: error:") and "--steps" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_run_bench_on_cuda(registry):
    rows, info = B.run_bench([registry.variants["baseline"]], tiny(), torch.device("cuda"), ["fp32", "bf16"],
                             steps=2, warmup=1, registry=registry, memory=True)
    assert all(r["peak_cuda_mb"] > 0 and r["step_ms_median"] > 0 for r in rows)
    assert info["peak_gflop_per_s"]["fp32"] > 0


@pytest.mark.parametrize("command", ["bench", "profile"])
def test_default_run_id_taken_gets_a_suffix(tmp_path, command):
    """Without --run-id the folder is ``<command>-<time>``; when that name is taken (two runs in one
    second) the run goes to ``-2``, never an error."""
    import datetime as dt

    now = dt.datetime.now()
    taken = {f"{command}-{now + dt.timedelta(seconds=k):%Y%m%d-%H%M%S}" for k in range(-1, 180)}
    for name in taken:
        (tmp_path / name).mkdir()
    extra = ["--steps", "2", "--no-memory", "--warmup-steps", "0"] if command == "bench" else []
    out = _cli(command, "--variants", "baseline", "--preset", "tiny", *extra,
               "--results-dir", str(tmp_path), "-q")
    assert out.returncode == 0, out.stderr
    new = {p.name for p in tmp_path.iterdir()} - taken
    assert len(new) == 1 and new.pop().endswith("-2")


def test_bench_eval_arms_per_seed(tmp_path, capsys):
    """``bench --group-sizes 2 --eval``: the sequential and batched evaluation arms, per seed, in
    bench.csv and on stdout; --eval without --group-sizes is one line, exit 2."""
    from harness.cli import main

    args = ["bench", "--variants", "baseline", "--preset", "tiny", "--set", "train.eval_sequences=16", "--eval",
            "--steps", "1", "--warmup-steps", "0", "--device", "cpu", "--results-dir", str(tmp_path), "-q"]
    assert main([*args, "--group-sizes", "2", "--run-id", "e"]) == 0
    assert json.loads((tmp_path / "e" / "config.json").read_text())["group_sizes"] == [2]  # was dropped once
    df = pd.read_csv(tmp_path / "e" / "bench.csv")
    assert list(df["arm"]) == ["sequential", "batched K=2"] and list(df["K"]) == [2, 2]
    assert (df["rows"] == 16).all() and (df["threads"] == 1).all()
    assert df["ms_per_seed"].tolist() == pytest.approx((df["eval_ms_median"] / 2).tolist())
    assert df["vs_sequential"].tolist() == pytest.approx([1.0, df["ms_per_seed"][0] / df["ms_per_seed"][1]])
    assert "batched K=2" in capsys.readouterr().out
    assert main([*args, "--run-id", "f"]) == 2
    err = capsys.readouterr().err
    assert "--eval times the evaluation of trial groups" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("name, cat", [
    ("aten::mm", "matmul"), ("aten::addmm", "matmul"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", "matmul"),
    ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_64x4_tn", "matmul"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float>", "attention"),
    ("aten::native_layer_norm_backward", "normalisation"), ("aten::_fused_adam_", "optimizer"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "elementwise"),
    ("aten::t", "views and allocation"), ("aten::tanh", "elementwise"), ("aten::embedding_dense_backward",
                                                                       "embedding and loss"),
    ("Memcpy HtoD (Pageable -> Device)", "copy and cast"), ("some_new_kernel", "other"),
    # names seen on an H200 (results/reference/gpu-h200-run4/bench-kernels-gpu), first read wrongly
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "matmul"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1_cga1x1x1_kernel0_0",
     "attention"),
    ("fmha_cutlassB_f32_aligned_64x64_k64_sm80(PyTorchMemEffAttention::AttentionBackwardKernel<cutlass::arch::Sm80",
     "attention"),
    ("void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernelTemplate<float, float, 32u>",
     "normalisation"),
    ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::CUDAFunctor_add"
     "<float> >(at::TensorIteratorBase&)", "elementwise"),
    ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_"
     "kernel_cuda(at::TensorIteratorBase&)", "copy and cast"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda(at::TensorIterator"
     "Base&)::{lambda(float)#1}>", "copy and cast"),
])
def test_kernel_categories_by_name(name, cat):
    from harness.perf.kernels import category

    assert category(name) == cat


def test_op_rows_sum_by_name_per_step_and_skip_other_devices():
    from types import SimpleNamespace as E

    from harness.perf.kernels import category_rows, op_rows

    cpu, cuda = torch.autograd.DeviceType.CPU, torch.autograd.DeviceType.CUDA
    events = [E(name="aten::mm", device_type=cpu, self_cpu_time_total=300.0),
              E(name="aten::mm", device_type=cpu, self_cpu_time_total=100.0),
              E(name="aten::add", device_type=cpu, self_cpu_time_total=100.0),
              E(name="gemm_kernel", device_type=cuda, device_time_total=900.0)]
    rows = op_rows(events, on_device=False, steps=2)
    assert [r["op"] for r in rows] == ["aten::mm", "aten::add"]
    assert rows[0]["calls_per_step"] == 1.0 and rows[0]["ms_per_step"] == pytest.approx(0.2)
    assert [r["share"] for r in rows] == pytest.approx([0.8, 0.2])
    gpu = op_rows(events, on_device=True, steps=1)
    assert [(r["op"], r["ms_per_step"], r["share"]) for r in gpu] == [("gemm_kernel", 0.9, 1.0)]
    cats = category_rows(rows)
    assert [(c["category"], c["ops"]) for c in cats] == [("matmul", 1), ("elementwise", 1)]


def test_bench_kernels_profiles_every_arm(tmp_path, capsys):
    """``bench --kernels N`` on the CPU: per arm the N largest ops by self time, matmuls among them,
    categories that cover the whole profiled time; the terminal's tables fit 120 columns and torch's
    profiler prints no start/stop lines (a fresh process: Kineto reads its log level once); with
    --group-sizes it is one line, exit 2."""
    import sys

    from harness.cli import main

    args = ["bench", "--variants", "baseline", "--preset", "tiny", "--steps", "2", "--warmup-steps", "1",
            "--device", "cpu", "--results-dir", str(tmp_path), "-q"]
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    proc = subprocess.run([sys.executable, "-m", "harness", *args, "--kernels", "5", "--run-id", "k"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "profiler_start" not in proc.stderr + proc.stdout  # torch 2.13's Kineto "USDT: ..." lines
    tables = [line for line in proc.stdout.splitlines() if line.startswith("|")]
    assert len(tables) >= 2 * (2 + 5) and max(map(len, tables)) <= 120
    assert any(line.startswith("|      1 | ") for line in tables)  # the ops' ranks as integers
    df = pd.read_csv(tmp_path / "k" / "bench.csv")
    assert set(df["arm"]) == {f"{B.REFERENCE} fp32", "baseline fp32"}
    for _, arm in df.groupby("arm"):
        assert list(arm["rank"]) == [1, 2, 3, 4, 5] and arm["ms_per_step"].is_monotonic_decreasing
        assert (arm["share"] > 0).all() and arm["share"].sum() < 1
    md = (tmp_path / "k" / "bench.md").read_text()
    assert "### baseline fp32" in md and "| matmul" in md and "CPU ops (self time)" in md
    assert main([*args, "--kernels", "5", "--group-sizes", "2", "--run-id", "g"]) == 2
    assert "--kernels N profiles" in capsys.readouterr().err


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_kernel_bench_on_cuda_counts_gpu_kernels(registry):
    from harness.perf.kernels import run_kernel_bench

    rows, info = run_kernel_bench([registry.variants["baseline"]], tiny(), torch.device("cuda"), ["bf16"], steps=2,
                                  warmup=1, registry=registry, top=10)
    assert info["unit"] == "GPU kernels" and set(info["ms_profiled"]) == {f"{B.REFERENCE} fp32",
                                                                           f"{B.REFERENCE} bf16", "baseline bf16"}
    assert all(ms > 0 for ms in info["ms_profiled"].values())
    assert any(c["category"] == "matmul" and c["share"] > 0 for c in info["categories"]["baseline bf16"])


def test_bench_compile_adds_a_compiled_contender_beside_each_variant(tmp_path, capsys, monkeypatch):
    """``bench --compile``: each variant also runs through ``torch.compile``, a row of its own with
    the eager model's parameters and FLOPs (counted on the wrapped model); it has no peak-memory measurement and is no "variant" in the targets' summary. Here with the
    ``eager`` backend (dynamo's tracing, no code generation) to stay fast; TorchInductor on the CPU:
    results/reference/bench-compile-cpu. With --group-sizes a CUDA-graph mode is one line, exit 2 (the captured
    arms make their own graphs)."""
    from harness.cli import main

    monkeypatch.setattr(B, "COMPILE_BACKEND", "eager")
    measured = []
    monkeypatch.setattr(B, "measure_peak_memory", lambda name, *a, **k: measured.append(name) or {"peak_rss_mb": 1.0,
                                                                                             "base_rss_mb": 0.0})
    args = ["bench", "--variants", "baseline", "pre_norm", "--preset", "tiny", "--steps", "1", "--warmup-steps", "1",
            "--device", "cpu", "--results-dir", str(tmp_path), "-q"]
    assert main([*args, "--compile", "--run-id", "c"]) == 0
    df = pd.read_csv(tmp_path / "c" / "bench.csv").set_index("contender")
    assert set(df.index) == {B.REFERENCE, "baseline", "pre_norm", "baseline compiled", "pre_norm compiled"}
    for v in ("baseline", "pre_norm"):
        row, comp = df.loc[v], df.loc[f"{v} compiled"]
        assert comp["kind"] == "compiled" and comp["params"] == row["params"]
        assert comp["gflop_per_step"] == pytest.approx(row["gflop_per_step"]) and comp["step_ms_median"] > 0
        assert math.isnan(comp["peak_rss_mb"]) and row["peak_rss_mb"] == 1.0
    assert sorted(measured) == sorted([B.REFERENCE, "baseline", "pre_norm"])
    assert "compiled" not in " ".join(line for line in capsys.readouterr().out.splitlines() if "variant" in line)
    assert main([*args, "--compile", "reduce-overhead", "--group-sizes", "2", "--run-id", "g"]) == 2
    assert "with --group-sizes, --compile takes one mode without CUDA graphs" in capsys.readouterr().err


def test_bench_compile_modes_each_a_contender_and_nondeterministic_recorded(tmp_path, capsys, monkeypatch):
    """``bench --compile default,max-autotune --nondeterministic``: one compiled contender per mode, each
    compiled with its mode (torch.compile's own keyword, spied; ``default`` passes none), its mode in
    bench.csv and config.json; the timed steps ran without deterministic algorithms and bench.md and
    config.json say so. An unknown mode is one line, exit 2. Under deterministic mode Inductor times no
    autotuning candidates (why --nondeterministic exists): ``use_deterministic_algorithms`` sets its flag."""
    from harness.cli import main
    from harness.env import trial_settings

    monkeypatch.setattr(B, "COMPILE_BACKEND", "eager")
    monkeypatch.setattr(B, "measure_peak_memory", lambda *a, **k: {"peak_rss_mb": 1.0, "base_rss_mb": 0.0})
    calls, real = [], torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: calls.append(kw) or real(model, **kw))
    deterministic_in_step = []
    real_step = B.train_step
    monkeypatch.setattr(B, "train_step", lambda *a, **k: deterministic_in_step.append(
        torch.are_deterministic_algorithms_enabled()) or real_step(*a, **k))
    args = ["bench", "--variants", "baseline", "--preset", "tiny", "--steps", "1", "--warmup-steps", "1",
            "--device", "cpu", "--results-dir", str(tmp_path), "-q", "--no-memory"]
    try:
        assert main([*args, "--compile", "default,max-autotune", "--nondeterministic", "--run-id", "m"]) == 0
        assert not torch._inductor.config.deterministic
    finally:
        trial_settings()
    assert torch._inductor.config.deterministic  # the trials' settings put Inductor in its deterministic mode
    assert [c.get("mode") for c in calls] == [None, "max-autotune"]
    assert all(c["backend"] == "eager" for c in calls)
    df = pd.read_csv(tmp_path / "m" / "bench.csv").set_index("contender")
    assert set(df.index) == {B.REFERENCE, "baseline", "baseline compiled", "baseline compiled max-autotune"}
    assert df.loc["baseline compiled max-autotune", "compile_mode"] == "max-autotune"
    assert df.loc["baseline compiled", "compile_mode"] == "default" and df.loc["baseline", "kind"] == "variant"
    assert deterministic_in_step and not any(deterministic_in_step)
    meta = json.loads((tmp_path / "m" / "config.json").read_text())
    assert meta["compile_modes"] == ["default", "max-autotune"] and meta["nondeterministic"] is True
    md = (tmp_path / "m" / "bench.md").read_text()
    assert "- deterministic: False" in md and "MFU of the compiled contenders: baseline compiled " in md
    # the settings still applied (flush-denormal) are not reported as "not applied"
    assert "deterministic_algorithms: off" in md and "flush_denormal: on" in md and "not applied" not in md
    assert "Timed **without** deterministic algorithms" in md
    assert main([*args, "--nondeterministic", "--group-sizes", "2", "--eval", "--run-id", "g"]) == 2
    assert "--compile and --nondeterministic go with the plain bench, --kernels or --group-sizes: drop --old and " \
           "--eval" in capsys.readouterr().err
    bad = cli_in_process(*args, "--compile", "fastest", "--run-id", "bad")
    assert bad.returncode == 2 and "unknown compile mode 'fastest'" in bad.stderr and "Traceback" not in bad.stderr


def test_bench_kernels_profiles_the_compiled_steps_too(tmp_path, monkeypatch):
    """``bench --kernels N --compile default,reduce-overhead``: an arm per compiled mode beside the eager ones, each
    profiled after its warm-up compiled it (here dynamo's ``eager`` backend, which keeps aten ops: a CPU-fast
    stand-in for Inductor, whose Triton kernels only a GPU shows); the mode reaches torch.compile."""
    from harness.cli import main

    monkeypatch.setattr(B, "COMPILE_BACKEND", "eager")
    calls, real = [], torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: calls.append(kw.get("mode")) or real(model, **kw))
    args = ["bench", "--variants", "baseline", "--preset", "tiny", "--steps", "1", "--warmup-steps", "1",
            "--device", "cpu", "--results-dir", str(tmp_path), "-q", "--kernels", "3"]
    assert main([*args, "--compile", "default,reduce-overhead", "--run-id", "kc"]) == 0
    assert calls == [None, "reduce-overhead"]
    df = pd.read_csv(tmp_path / "kc" / "bench.csv")
    assert set(df["arm"]) == {f"{B.REFERENCE} fp32", "baseline fp32", "baseline compiled fp32",
                              "baseline compiled reduce-overhead fp32"}
    md = (tmp_path / "kc" / "bench.md").read_text()
    assert "### baseline compiled reduce-overhead fp32" in md
