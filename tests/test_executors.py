"""Where ``--executor ray`` connects. Ray and sequential execution giving the same rows, with a
``--plugin`` file shipped to the Ray workers: tests/test_ray_cluster.py (a real two-node
cluster); ``--jobs 2`` against sequential: tests/test_determinism.py.
"""
from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys

import pytest

import harness.workers as workers

from harness.env import ray_address

from .conftest import ROOT


def test_ray_address_precedence(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert ray_address(None) == "local"  # never a bare ray.init() that attaches to a stale cluster
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert ray_address(None) == "10.0.0.5:6379"
    assert ray_address("ray://head:10001") == "ray://head:10001"


def test_a_local_pool_run_starts_its_fork_server_before_the_check():
    """``warm_workers``: with trials bound for local worker processes the fork server (and its import
    of the harness) starts before the pre-training check; not for one process, one trial or Ray."""
    code = (
        "import multiprocessing.forkserver as fs\n"
        "from harness.beside import warm_workers\n"
        "from harness.runmeta import Execution\n"
        "print(warm_workers(Execution(jobs=1), 4), warm_workers(Execution(jobs=2), 1),"
        " warm_workers(Execution(executor='ray', address='auto', jobs=1), 4), fs._forkserver._forkserver_pid is None)\n"
        "print(warm_workers(Execution(jobs=2), 4), fs._forkserver._forkserver_pid is not None)\n")
    if "forkserver" not in multiprocessing.get_all_start_methods():
        pytest.skip("no forkserver on this platform")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["False", "False", "False", "True", "True", "True"], proc.stdout


@pytest.mark.parametrize("options, gpu, early", [
    (["--jobs", "2"], True, True), (["--jobs", "1"], True, False), (["--device", "cpu"], True, False),
    (["--jobs", "2"], False, False)])
def test_on_a_gpu_machine_run_starts_the_fork_server_before_it_imports_torch(tmp_path, options, gpu, early):
    """``run`` with worker processes likely on a GPU (a GPU driver's device node, not ``--jobs 1``, Ray or
    ``--device cpu``) starts the fork server before this process's own import of torch, so the server's
    import overlaps this process's import, planning and check (on an H200 machine, where torch loads in
    seconds, 6-7 s passed between the check and the main job's first trial: results/reference/gpu-h200-run5).
    Elsewhere the server starts with the pool, as before: a CPU-only machine gains ~0.2 s and would pay
    a core's second of importing for every command that needs no workers. ``gpu`` stands in for the
    device node (``harness.workers.gpu_likely``)."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        pytest.skip("no forkserver on this platform")
    code = (
        "import sys, multiprocessing.forkserver as fs\n"
        "import harness.workers as workers\n"
        f"workers.gpu_likely = lambda: {gpu}\n"
        "class Seen:\n"
        "    at_torch = None\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' and self.at_torch is None:\n"
        "            self.at_torch = fs._forkserver._forkserver_pid is not None\n"
        f"            if {not early}:  # the state at torch's import is all it takes; only the early server's run goes on\n"
        "                print(0, self.at_torch, flush=True); import os; os._exit(0)\n"
        "        return None\n"
        "seen = Seen(); sys.meta_path.insert(0, seen)\n"
        "from harness.cli import main\n"
        f"rc = main(['run', '--variants', 'baseline', 'pre_norm', '--preset', 'tiny', '--set', 'train.steps=2', "
        f"'--set', 'train.eval_sequences=16', *{options!r}, '--no-check', '-q', '--results-dir', {str(tmp_path)!r}])\n"
        "print(rc, seen.at_torch)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-2:] == ["0", str(early)], (proc.stdout[-2000:], proc.stderr[-2000:])
    assert workers.gpu_likely() == any(os.path.exists(n) for n in workers.GPU_NODES)


def test_the_report_modules_load_in_the_background_only_beside_the_trials():
    """``preload_report_modules``: beside the trials (``idle_beside``), scipy.stats and matplotlib.pyplot are
    imported in a daemon thread during training (the report after the last trial needed over a second for
    them); otherwise nothing starts. A fresh interpreter, so that the imports are the thread's own."""
    code = ("import sys\n"
            "from harness.beside import preload_report_modules\n"
            "assert preload_report_modules(False) is None\n"
            "before = {m for m in ('scipy.stats', 'matplotlib.pyplot') if m in sys.modules}\n"
            "thread = preload_report_modules(True)\n"
            "thread.join(120)\n"
            "print(sorted(before), thread.daemon, thread.is_alive(), 'scipy.stats' in sys.modules,\n"
            "      'matplotlib.pyplot' in sys.modules, __import__('matplotlib').get_backend().lower())\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["[]", "True", "False", "True", "True", "agg"]


def test_work_goes_beside_the_trials_only_where_it_takes_no_core_from_them(monkeypatch):
    """``trains_elsewhere``: a local pool (``--jobs`` >= 2, two trials or more) or Ray. ``idle_beside``: that,
    and the trials on CUDA or the pool leaving cores free (on a CPU the workers fill, work beside them would
    slow the first trials and bias their timing columns)."""
    from harness import beside
    from harness.runmeta import Execution
    from harness.trial import TrialSpec

    assert [beside.trains_elsewhere(Execution(jobs=j), n) for j, n in [(1, 5), (2, 1), (2, 2), (4, 11)]] == [
        False, False, True, True]
    assert beside.trains_elsewhere(Execution(executor="ray", address="auto"), 1)
    cpu = [TrialSpec(variant="baseline", slots={}, config={}, seed=s, device="cpu") for s in range(4)]
    cuda = [TrialSpec(variant="baseline", slots={}, config={}, seed=s, device="cuda") for s in range(4)]
    monkeypatch.setattr(beside, "available_cores", lambda: 2)
    assert not beside.idle_beside(Execution(jobs=2, threads=1), cpu)  # two workers fill two cores
    assert beside.idle_beside(Execution(jobs=2, threads=1), cuda)
    assert not beside.idle_beside(Execution(jobs=1), cuda)
    monkeypatch.setattr(beside, "available_cores", lambda: 16)
    assert beside.idle_beside(Execution(jobs=2, threads=1), cpu)
    assert not beside.idle_beside(Execution(executor="ray", address="auto"), cpu)


def test_the_check_thread_computes_and_the_caller_records():
    """``pretraining_check``: in the foreground ``keep(check_now())`` has run when it returns; beside the
    trials ``check_now`` runs in a thread (here still blocked when the call returns) and ``keep`` runs in the
    caller's thread at ``wait()`` (config.json has one writer); an unexpected error becomes the record's
    ``error`` instead of ending the run after its trials."""
    import threading

    from harness.beside import pretraining_check

    kept: list = []
    pretraining_check(lambda: {"classes": [["a"]]}, lambda r: kept.append((threading.current_thread().name, r)),
                      beside=False)
    assert kept == [("MainThread", {"classes": [["a"]]})]
    go, ran = threading.Event(), []

    def slow_check() -> dict:
        go.wait(30)
        ran.append(threading.current_thread().name)
        return {"classes": [["b"]]}

    wait = pretraining_check(slow_check, lambda r: kept.append((threading.current_thread().name, r)), beside=True)
    assert len(kept) == 1 and not ran  # the caller goes on (to the trials) while the check runs
    go.set()
    wait()
    assert ran == ["harness-check"] and kept[1] == ("MainThread", {"classes": [["b"]]})

    def broken() -> dict:
        raise KeyError("no such slot")

    wait = pretraining_check(broken, kept.append, beside=True)
    wait()
    assert kept[2]["classes"] == [] and kept[2]["error"] == "KeyError: 'no such slot'"


@pytest.mark.parametrize("cores", [2, 16])
def test_a_check_beside_the_workers_is_recorded_and_logged_to_the_run_folder(tmp_path, monkeypatch, cores):
    """With two worker processes on 2 cores the check runs first, on 16 beside the trials: either way its
    classes reach config.json and the report, and its line the run's log.txt (under ``-q`` too, where stderr
    stays quiet)."""
    import json

    from harness import beside

    from .conftest import cli_in_process

    monkeypatch.setattr(beside, "available_cores", lambda: cores)
    threads = []
    real = beside.pretraining_check
    monkeypatch.setattr("harness.launch.pretraining_check", lambda *a: threads.append(a[-1]) or real(*a))

    r = cli_in_process("run", "--variants", "baseline", "additive_mask", "pre_norm", "--preset", "tiny", "--jobs", "2",
                       "--threads", "1", "--device", "cpu", "-q", "--results-dir", str(tmp_path), "--run-id", "b")
    assert r.returncode == 0, r.stderr
    assert "check:" not in r.stderr
    log = (tmp_path / "b" / "log.txt").read_text().splitlines()
    assert log[0].startswith("run ") and sum(ln.startswith("check: 3 variant(s), 2 class(es)") for ln in log) == 1, log
    assert ["additive_mask", "baseline"] in json.loads((tmp_path / "b" / "config.json").read_text())["check"]["classes"]
    assert "- class 1: additive_mask, baseline" in (tmp_path / "b" / "report.md").read_text()
    assert threads == [cores == 16]
