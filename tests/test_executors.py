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
        "from harness.launch import warm_workers\n"
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


def test_the_report_modules_load_in_the_background_only_while_other_processes_train():
    """``preload_report_modules``: with a worker pool (or Ray) and two trials or more, scipy.stats and
    matplotlib.pyplot are imported in a daemon thread during training (the report after the last trial
    needed over a second for them); with ``--jobs 1`` or one trial this process trains, so nothing
    starts. A fresh interpreter, so that the imports are the thread's own."""
    code = ("import sys\n"
            "from harness.launch import preload_report_modules\n"
            "from harness.runmeta import Execution\n"
            "assert preload_report_modules(Execution(jobs=1), 4) is None\n"
            "assert preload_report_modules(Execution(jobs=2), 1) is None\n"
            "before = {m for m in ('scipy.stats', 'matplotlib.pyplot') if m in sys.modules}\n"
            "thread = preload_report_modules(Execution(jobs=2), 2)\n"
            "thread.join(120)\n"
            "print(sorted(before), thread.daemon, thread.is_alive(), 'scipy.stats' in sys.modules,\n"
            "      'matplotlib.pyplot' in sys.modules, __import__('matplotlib').get_backend().lower())\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["[]", "True", "False", "True", "True", "agg"]


def test_the_check_runs_beside_the_trials_only_where_other_processes_train_them():
    """``trains_elsewhere``: a local pool (``--jobs`` >= 2, two trials or more) or Ray. ``start_check``: in
    the foreground it has run when it returns; beside the trials it runs in a thread (here still blocked
    when ``start_check`` returns), ``wait()`` joins it and raises what the check raised."""
    import threading

    from harness.launch import start_check, trains_elsewhere
    from harness.runmeta import Execution

    assert [trains_elsewhere(Execution(jobs=j), n) for j, n in [(1, 5), (2, 1), (2, 2), (4, 11)]] == [
        False, False, True, True]
    assert trains_elsewhere(Execution(executor="ray", address="auto"), 1)
    ran: list[str] = []
    start_check(lambda: ran.append("now"), beside=False)
    assert ran == ["now"]
    go = threading.Event()

    def slow_check() -> None:
        go.wait(30)
        ran.append("beside")

    wait = start_check(slow_check, beside=True)
    assert ran == ["now"]  # the caller goes on (to the trials) while the check runs
    go.set()
    wait()
    assert ran == ["now", "beside"]

    def broken() -> None:
        raise KeyError("check broke")

    wait = start_check(broken, beside=True)
    with pytest.raises(KeyError, match="check broke"):
        wait()


def test_a_check_beside_the_workers_is_recorded_and_logged_to_the_run_folder(tmp_path):
    """With two worker processes the check runs beside the trials: its classes still reach config.json
    and the report, and its line reaches the run's log.txt (under ``-q`` too, where stderr stays quiet)."""
    import json

    from .conftest import cli_in_process

    r = cli_in_process("run", "--variants", "baseline", "additive_mask", "pre_norm", "--preset", "tiny", "--jobs", "2",
                       "--device", "cpu", "-q", "--results-dir", str(tmp_path), "--run-id", "b")
    assert r.returncode == 0, r.stderr
    assert "check:" not in r.stderr
    log = (tmp_path / "b" / "log.txt").read_text().splitlines()
    assert log[0].startswith("run ") and sum(ln.startswith("check: 3 variant(s), 2 class(es)") for ln in log) == 1, log
    assert ["additive_mask", "baseline"] in json.loads((tmp_path / "b" / "config.json").read_text())["check"]["classes"]
    assert "- class 1: additive_mask, baseline" in (tmp_path / "b" / "report.md").read_text()
