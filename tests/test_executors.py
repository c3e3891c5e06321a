"""Ray and sequential execution give the same rows for the same seeds (``--jobs 2`` against
sequential, with the same plugin file: tests/test_determinism.py).

One local Ray cluster is started for the module (~5 s); the CLI joins it through
``RAY_ADDRESS`` as a driver would join a real cluster (so the harness code and the
``--plugin`` file are shipped to the workers, see :func:`harness.executors.run_ray`).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]' to test --executor ray")

from harness.env import ray_address  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_PLUGIN = ROOT / "examples" / "harness-example" / "harness_example.py"
TIMING = {"wall_s", "train_s", "step_ms", "tokens_per_s", "time_to_solve_s", "peak_mem_mb", "overhead_share"}


@pytest.fixture(scope="module")
def ray_cluster():
    """A private local Ray cluster on loopback; yields its address."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    info = ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                    logging_level="ERROR")
    try:
        yield info.address_info["address"]
    finally:
        ray.shutdown()


def _cli(*args: str, **env_extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # only the one given below
    env.update({"HARNESS_DISABLE_PLUGIN_AUTOLOAD": "1",
                "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **env_extra})
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=ROOT)


def _rows(path: Path) -> pd.DataFrame:
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    df = df.drop(columns=[c for c in df.columns if c in TIMING])
    return df.sort_values(["variant", "seed"]).reset_index(drop=True)


def test_ray_and_sequential_give_the_same_rows(tmp_path, ray_cluster):
    common = ["--plugin", str(EXAMPLE_PLUGIN), "run", "--variants", "baseline,example_rmsnorm",
              "--preset", "tiny", "--seeds", "2", "--threads", "1", "--results-dir", str(tmp_path), "--no-check"]
    seq = _cli(*common, "--run-id", "sequential", "--jobs", "1", "-q")
    on_ray = _cli(*common, "--run-id", "ray", "--executor", "ray", RAY_ADDRESS=ray_cluster)
    for proc in (seq, on_ray):
        assert proc.returncode == 0, proc.stderr
    assert f"ray cluster {ray_cluster}: 2 CPU(s)" in on_ray.stderr  # joined the fixture's cluster
    assert on_ray.stderr.count("-> stored in") == 4
    a, c = (_rows(tmp_path / run / "trials.csv") for run in ("sequential", "ray"))
    assert len(a) == 4 and set(a["variant"]) == {"baseline", "example_rmsnorm"}
    assert (a["status"] == "ok").all() and (a["threads"] == "1").all()
    pd.testing.assert_frame_equal(a, c)


def test_ray_address_precedence(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert ray_address(None) == "local"  # never a bare ray.init() that attaches to a stale cluster
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert ray_address(None) == "10.0.0.5:6379"
    assert ray_address("ray://head:10001") == "ray://head:10001"
