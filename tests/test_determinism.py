"""Same seed, config, device and threads per trial -> bitwise-identical metrics on CPU, whether
a trial runs twice in one process, in the CLI's process or in a ``--jobs 2`` worker."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness.config import get_preset
from harness.env import threads_per_trial
from harness.runner import make_specs
from harness.train import run_trial

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_PLUGIN = ROOT / "examples" / "harness-example" / "harness_example.py"
#: columns that measure time or memory, not what was computed
TIMING = {"wall_s", "train_s", "step_ms", "tokens_per_s", "time_to_solve_s", "peak_mem_mb", "overhead_share"}


def without_timing(row: dict) -> str:
    """The row minus timing columns, as JSON (NaN compares equal to NaN as text)."""
    return json.dumps({k: v for k, v in row.items() if k not in TIMING and k != "traceback"}, sort_keys=True)


def curve_values(curve: list[dict]) -> str:
    return json.dumps([{k: v for k, v in c.items() if k != "wall_s"} for c in curve])


@pytest.mark.parametrize("name", ["baseline", "seed_002"])
def test_run_trial_twice_gives_identical_rows_and_curves(registry, name):
    cfg = get_preset("tiny").override({"model.dropout": 0.1})  # dropout: the RNG stream matters too
    spec = make_specs([registry.variants[name]], [3], cfg, "cpu", "fp32", {}, threads=1)[0]
    a, b = run_trial(spec), run_trial(spec)
    assert a.status == "ok", a.reason
    assert a.row["threads"] == 1
    assert without_timing(a.row) == without_timing(b.row)
    assert curve_values(a.curve) == curve_values(b.curve)
    other = run_trial(dataclasses.replace(spec, seed=4))
    assert curve_values(other.curve) != curve_values(a.curve)


@pytest.mark.parametrize("cores", [1, 2, 3, 4, 8, 16])
def test_workers_never_oversubscribe_the_cores(cores):
    for jobs in range(1, cores + 1):
        threads = threads_per_trial(jobs, cores=cores)
        assert threads >= 1 and jobs * threads <= cores
    assert threads_per_trial(cores + 3, cores=cores) == 1
    assert threads_per_trial(2, threads=3, cores=cores) == 3  # --threads wins


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HARNESS_DISABLE_PLUGIN_AUTOLOAD": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=ROOT)


def comparable_csv(path: Path, drop: set[str]) -> pd.DataFrame:
    """A stored CSV as text cells (exact float repr), timing columns dropped, rows sorted."""
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    keys = [c for c in ("variant", "point", "seed", "split", "step") if c in df.columns]
    return df.drop(columns=[c for c in df.columns if c in drop]).sort_values(keys).reset_index(drop=True)


def test_sequential_and_jobs_2_give_bitwise_equal_rows(tmp_path):
    # a --plugin file's variant too: the pool's workers import the file (the plugin reaches them)
    common = ["--plugin", str(EXAMPLE_PLUGIN), "run", "--variants", "baseline,example_rmsnorm,seed_002", "--preset",
              "tiny", "--set", "model.dropout=0.1", "--seeds", "2", "--threads", "1", "--results-dir", str(tmp_path),
              "-q", "--no-check"]
    seq = _cli(*common, "--run-id", "sequential")
    par = _cli(*common, "--run-id", "jobs2", "--jobs", "2")
    assert seq.returncode == 0, seq.stderr
    assert par.returncode == 0, par.stderr
    a = comparable_csv(tmp_path / "sequential" / "trials.csv", TIMING)
    b = comparable_csv(tmp_path / "jobs2" / "trials.csv", TIMING)
    assert len(a) == 6 and (a["threads"] == "1").all()
    assert set(a["variant"]) == {"baseline", "example_rmsnorm", "seed_002"}
    pd.testing.assert_frame_equal(a, b)
    pd.testing.assert_frame_equal(comparable_csv(tmp_path / "sequential" / "curves.csv", {"wall_s"}),
                                  comparable_csv(tmp_path / "jobs2" / "curves.csv", {"wall_s"}))
    meta = json.loads((tmp_path / "jobs2" / "config.json").read_text())
    env = meta["environment"]
    for key in ("torch", "python", "platform", "cpu", "git_commit"):
        assert env.get(key), key
    assert env["deterministic"] is True and env["threads"] == 1
    assert meta["execution"] == {"executor": "local", "jobs": 2, "threads": 1, "address": None, "vectorise_seeds": "off",
                                 "capture": "auto"}
    assert {t["spec"]["threads"] for t in meta["trials"]} == {1}


@pytest.mark.cuda
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("vectorise", ["off", "on"])
def test_jobs_2_on_one_gpu_gives_the_rows_of_one_process(tmp_path, vectorise):
    """Issue 27, item 5: several trial processes share one GPU (``--jobs 2 --device cuda``: different
    variants, which do not vectorise together; with ``on`` each worker trains one captured trial group
    at a time). Each worker process opens its own CUDA context; the rows must be those of the same
    trials (or groups) run one after another in one process."""
    common = ["run", "--variants", "baseline,pre_norm", "--preset", "tiny", "--seeds", "2", "--device", "cuda",
              "--results-dir", str(tmp_path), "-q", "--no-check", "--vectorise-seeds", vectorise]
    one = _cli(*common, "--run-id", "one")
    two = _cli(*common, "--run-id", "two", "--jobs", "2")
    assert one.returncode == 0, one.stderr
    assert two.returncode == 0, two.stderr
    def rows(run: str) -> pd.DataFrame:
        df = pd.read_csv(tmp_path / run / "trials.csv")
        df = df.drop(columns=[c for c in df.columns if c in TIMING | {"threads", "group_wall_s"}])
        return df.sort_values(["variant", "seed"]).reset_index(drop=True)

    a, b = rows("one"), rows("two")
    assert len(a) == 4 and (a["device"] == "cuda").all() and (a["status"] == "ok").all()
    pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=1e-4)  # GPU kernels, two processes: not bitwise
    assert json.loads((tmp_path / "two" / "config.json").read_text())["execution"]["jobs"] == 2


def test_git_commit_says_when_the_code_differs_from_its_commit(tmp_path):
    """A run made from a checkout with uncommitted code changes must not claim the commit's code."""
    import shutil
    import subprocess

    from harness.env import git_commit

    if shutil.which("git") is None:
        pytest.skip("needs git")
    assert git_commit(str(tmp_path)) == "unknown"  # not a checkout
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True)
    for folder in ("harness", "variants", "docs"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "a.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "."], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "c"], cwd=tmp_path, check=True)
    clean = git_commit(str(tmp_path))
    assert len(clean) >= 7 and "+" not in clean
    (tmp_path / "docs" / "a.py").write_text("x = 2\n")  # not code: still the commit
    (tmp_path / "results.txt").write_text("untracked\n")
    assert git_commit(str(tmp_path)) == clean
    (tmp_path / "variants" / "a.py").write_text("x = 2\n")
    assert git_commit(str(tmp_path)) == clean + "+uncommitted"
