"""Two ``run`` processes at once, as two users (or two shell tabs) would start them.

* Same ``--run-id``: the second exits 2 with one line saying the run is being written by
  another process, and writes nothing; the first finishes untouched.
* Different run ids in one results directory: both run and both finish.

To make "at once" deterministic on a loaded machine, the first run is frozen with SIGSTOP
while it holds its run's lock (mid-trial) and thawed with SIGCONT after the second is done.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from harness import cli
from harness.store import RunStore

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 240

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGSTOP") or sys.platform == "win32",
                                reason="needs POSIX signals and flock")


def _argv(results: Path, run_id: str, seeds: int = 2, steps: int = 300) -> list[str]:
    return [sys.executable, "-m", "harness", "run", "--variants", "baseline", "--preset", "tiny", "--seeds",
            str(seeds), "--set", f"train.steps={steps}", "--device", "cpu", "--jobs", "1", "--threads", "1",
            "--results-dir", str(results), "--run-id", run_id, "-q", "--no-check"]


def _env() -> dict[str, str]:
    return {**os.environ, "HARNESS_DISABLE_PLUGIN_AUTOLOAD": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _start(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=ROOT)


def _frozen_while_locked(proc: subprocess.Popen, run: Path) -> None:
    """Wait until ``proc`` holds ``run``'s lock, then SIGSTOP it (it stays mid-run, lock held)."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the first run ended before it could be caught running: {proc.communicate()}")
        if (run / "config.json").is_file() and RunStore(run).is_locked():
            os.kill(proc.pid, signal.SIGSTOP)
            if RunStore(run).is_locked():
                return
            os.kill(proc.pid, signal.SIGCONT)  # it finished in between: cannot happen with 300 steps
        time.sleep(0.05)
    proc.kill()
    pytest.fail("the first run never took its lock")


def _finish(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"run did not finish in {TIMEOUT_S} s: {err}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def test_second_run_with_the_same_run_id_exits_2_and_writes_nothing(tmp_path):
    results = tmp_path / "results"
    first = _start(_argv(results, "same"))
    try:
        _frozen_while_locked(first, results / "same")
        before = _snapshot(results / "same")
        second = subprocess.run(_argv(results, "same"), capture_output=True, text=True, env=_env(), cwd=ROOT,
                                timeout=TIMEOUT_S)
        assert second.returncode == 2, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("harness: error: run ")
        assert "is being written by another process" in lines[0] and "choose another --run-id" in lines[0]
        assert _snapshot(results / "same") == before  # the second process wrote nothing
        assert sorted(p.name for p in results.iterdir()) == ["same"]  # and made no 'same-2'
    finally:
        os.kill(first.pid, signal.SIGCONT)
    done = _finish(first)
    assert done.returncode == 0, done.stderr
    trials = pd.read_csv(results / "same" / "trials.csv")
    assert sorted(trials.seed) == [0, 1] and set(trials.status) == {"ok"}
    assert cli.main(["verify", str(results / "same"), "-q"]) == 0


def test_two_run_ids_in_one_results_directory_run_side_by_side(tmp_path):
    results = tmp_path / "results"
    first = _start(_argv(results, "a"))
    try:
        _frozen_while_locked(first, results / "a")
        # "a" is mid-run and holds its lock; "b" runs from start to end meanwhile
        second = subprocess.run(_argv(results, "b", seeds=1, steps=20), capture_output=True, text=True,
                                env=_env(), cwd=ROOT, timeout=TIMEOUT_S)
        assert second.returncode == 0, second.stderr
        assert RunStore(results / "a").is_locked()
    finally:
        os.kill(first.pid, signal.SIGCONT)
    done = _finish(first)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in results.iterdir()) == ["a", "b"]
    assert sorted(pd.read_csv(results / "a" / "trials.csv").seed) == [0, 1]
    assert sorted(pd.read_csv(results / "b" / "trials.csv").seed) == [0]
    for run in ("a", "b"):
        assert cli.main(["verify", str(results / run), "-q"]) == 0
