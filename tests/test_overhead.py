"""``harness profile`` (the harness's share of a trial's wall time) and ``--jobs auto``."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from harness.perf import overhead as O
from harness.config import get_preset
from harness.runmeta import Execution
from harness.runner import make_specs
from harness.train import PHASES

from .conftest import cli_in_process

ROOT = Path(__file__).resolve().parents[1]


def test_profile_trial_splits_the_wall_time_into_the_loops_phases(registry, tmp_path):
    cfg = get_preset("tiny")
    (spec,) = make_specs([registry.variants["baseline"]], [0], cfg, "cpu", "fp32", {})
    written = []
    result, prof = O.profile_trial(spec, written.append)
    assert written == [result] and result.status == "ok"
    phases = prof["phases"]
    assert set(phases) == set(PHASES)
    assert phases["step"]["calls"] == phases["data"]["calls"] == phases["log"]["calls"] == cfg.train.steps
    assert phases["evaluate"]["calls"] == cfg.train.steps // cfg.train.eval_every - 1 + 1  # probes + the run gate at initialisation
    assert phases["final_eval"]["calls"] == phases["build"]["calls"] == phases["store"]["calls"] == 1
    covered = sum(p["s"] for p in phases.values())
    assert 0 < covered <= prof["wall_s"] * 1.001
    assert prof["overhead_s"] == pytest.approx(prof["wall_s"] - phases["step"]["s"])
    assert prof["overhead_share"] == pytest.approx(prof["overhead_s"] / prof["wall_s"])
    rows = O.profile_rows("baseline", prof)
    assert [r["phase"] for r in rows][-1] == "wall"
    line = O.verdict("baseline", prof, target=1.0)
    assert "meets the target <= 100%" in line
    assert "misses" in O.verdict("baseline", prof, target=0.0)


def test_count_ops_counts_kernels_not_views_allocations_or_composites_in_any_grad_mode():
    """A linear layer is one addmm whether gradients are on or not: under inference mode the dispatch
    mode sees the composite ``linear`` itself (not its parts), and counting it, or nothing, would be
    wrong; views, ``_unsafe_view`` and ``empty`` launch no kernel."""
    import torch.nn.functional as F

    x, w, b = torch.randn(3, 4), torch.randn(5, 4), torch.randn(5)
    for mode in (torch.enable_grad, torch.no_grad, torch.inference_mode):
        with mode():
            assert O.count_ops(lambda: F.linear(x, w, b)) == 1, mode
            assert O.count_ops(lambda: F.layer_norm(x, (4,))) == 1, mode
            assert O.count_ops(lambda: x.t().reshape(12)) == 1, mode  # the copy; the views are free
            assert O.count_ops(lambda: torch.ops.aten._unsafe_view(x, (12,))) == 0, mode
            assert O.count_ops(lambda: torch.empty(3)) == 0, mode
    assert not O.launches_work(torch.ops.aten.linear.default) and O.launches_work(torch.ops.aten.addmm.default)


def test_count_ops_counts_each_phases_ops_and_sees_the_one_pass_prefix_logits(registry, monkeypatch):
    """--count-ops: the ops each phase dispatches (views left out). The one-pass prefix logits
    (HARNESS_PREFIX_PASS=batched) must show as far fewer evaluation ops, with the same scores."""
    from harness.env import PREFIX_ENV

    cfg = get_preset("tiny")
    (spec,) = make_specs([registry.variants["baseline"]], [0], cfg, "cpu", "fp32", {})
    got = {}
    for mode in ("loop", "batched"):
        monkeypatch.setenv(PREFIX_ENV, mode)
        got[mode] = O.profile_trial(spec, lambda r: None, count_ops=True)
    (res_loop, loop), (res_batched, batched) = got["loop"], got["batched"]
    assert set(loop["ops"]) == set(PHASES) | {O.NO_PHASE}
    for phase in ("build", "data", "step", "evaluate", "final_eval"):
        assert loop["ops"][phase] > 0, phase
    assert loop["ops"]["store"] == 0  # writing JSON dispatches no aten op
    assert loop["ops"]["step"] == batched["ops"]["step"]  # training is not touched by the prefix pass
    # fewer in every evaluation (a quick-preset trial's 3.1x fewer: results/reference/profile-ops-cpu)
    assert batched["ops"]["evaluate"] < loop["ops"]["evaluate"], (loop["ops"], batched["ops"])
    assert batched["ops"]["final_eval"] < loop["ops"]["final_eval"], (loop["ops"], batched["ops"])
    assert res_loop.row["heldout_ce"] == pytest.approx(res_batched.row["heldout_ce"], rel=1e-5)
    rows = {r["phase"]: r for r in O.profile_rows("baseline", loop)}
    assert rows["evaluate"]["ops/call"] == round(loop["ops"]["evaluate"] / loop["phases"]["evaluate"]["calls"])
    assert rows["wall"]["ops"] == sum(loop["ops"].values())
    assert rows["overhead (all but step)"]["ops"] == rows["wall"]["ops"] - loop["ops"]["step"]


def test_profile_command_writes_a_table_and_the_trial(tmp_path):
    out = cli_in_process("profile", "--variants", "baseline", "--preset", "tiny", "--results-dir", str(tmp_path),
                         "--run-id", "p", "--count-ops", "-q")
    assert out.returncode == 0, out.stderr
    assert "harness overhead" in out.stdout
    run = tmp_path / "p"
    frame = pd.read_csv(run / "profile.csv")
    assert {"build", "data", "step", "log", "evaluate", "final_eval", "store", "wall"} <= set(frame.phase)
    assert (frame.set_index("phase").loc[["step", "evaluate"], "ops"] > 0).all()  # --count-ops
    assert (run / "trials" / "baseline__s0.json").exists() or list((run / "trials").glob("*.json"))
    md = (run / "profile.md").read_text()
    assert "python -m harness profile" in md and "## Environment" in md
    assert json.loads((run / "config.json").read_text())["kind"] == "profile"


@pytest.mark.parametrize("n, device, executor, threads, want", [
    (11, "cpu", "local", None, "cores"),  # one worker per core
    (1, "cpu", "local", None, 1),  # a single trial runs here
    (11, "cuda", "local", None, "gpu"),  # GPU_JOBS worker processes of captured groups, at most one per core
    (11, "cpu", "ray", None, 1),
    (11, "cpu", "local", 1024, 1),  # threads per trial fill the machine (1024: the most --threads accepts)
])
def test_jobs_auto(n, device, executor, threads, want):
    from harness.env import available_cores
    from harness.runmeta import GPU_JOBS

    opts = Execution(executor, "auto", threads).validate().resolved(n, device)
    expected = {"cores": min(n, available_cores()), "gpu": min(GPU_JOBS, n, available_cores())}.get(want, want)
    assert opts.jobs == expected
    assert opts.trial_threads() >= 1
    assert Execution("local", 3).resolved(n, device).jobs == 3  # a number is kept


def test_run_records_the_resolved_jobs(tmp_path):
    out = cli_in_process("run", "--variants", "baseline", "pre_norm", "--preset", "tiny", "--device", "cpu",
                         "--results-dir", str(tmp_path), "--run-id", "r", "-q")
    assert out.returncode == 0, out.stderr
    meta = json.loads((tmp_path / "r" / "config.json").read_text())
    from harness.env import available_cores

    assert meta["execution"]["jobs"] == min(2, available_cores())
    rows = pd.read_csv(tmp_path / "r" / "trials.csv")
    assert set(rows.threads) == {max(1, available_cores() // min(2, available_cores()))}
