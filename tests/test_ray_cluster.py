"""A real two-node Ray cluster on this machine: trials survive a worker killed mid-trial.

The test starts a head node and a second node with ``ray start`` (1 CPU each, a private temp
dir and free ports, each node in a session of its own), runs four trials (one variant from a
``--plugin`` file) through ``python -m harness --plugin FILE run --executor ray --address HEAD``,
SIGKILLs a Ray worker process of the second node while it runs a trial, and checks that Ray's
retry stored every trial exactly once with the same metrics as a local run with the same seeds
and threads.

The cluster is stopped in a ``finally`` by signalling the processes of the sessions its two
``ray start`` commands were started in (SIGTERM, then SIGKILL after 2 s: Ray's GCS server and monitor
ignore SIGTERM, so a longer wait only waits): ``ray stop`` would stop every Ray process on the
machine, including other users' clusters and other tests' ones.
Every subprocess has a timeout. When ``ray start`` itself fails (no Ray, no free ports, a
sandbox without the needed sockets) the test is skipped with Ray's own message.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]' to test --executor ray")

from harness import cli  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TIMING = {"wall_s", "train_s", "step_ms", "tokens_per_s", "time_to_solve_s", "peak_mem_mb", "overhead_share"}
RAY = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))
EXAMPLE_PLUGIN = ROOT / "examples" / "harness-example" / "harness_example.py"
#: the run under test: 4 trials of ~1-3 s each (long enough to be caught running), one variant from a
#: --plugin file (its source is shipped to the workers: harness.executors.ray_cluster.run_ray)
RUN = ["--plugin", str(EXAMPLE_PLUGIN), "run", "--variants", "baseline,example_rmsnorm", "--preset", "tiny", "--seeds",
       "2", "--set", "train.steps=300", "--threads", "1", "--device", "cpu", "--no-check"]

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs POSIX sessions and /proc")]


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    # RAY_AUTH_MODE explicit: with a ~/.ray/auth_token on the machine (left by anyone), Ray 2.60's
    # 'ray start --head' turns token authentication on while 'ray start --address' does not.
    env.update({"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "HARNESS_DISABLE_PLUGIN_AUTOLOAD": "1",
                "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    return env


def _node_ports() -> list[str]:
    agent, grpc, runtime_env, metrics, node_manager, object_manager = _free_ports(6)
    return [f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={grpc}",
            f"--runtime-env-agent-port={runtime_env}", f"--metrics-export-port={metrics}",
            f"--node-manager-port={node_manager}", f"--object-manager-port={object_manager}"]


def _session_pids(sids: set[int]) -> dict[int, str]:
    """pid -> command line of the live processes in the sessions ``sids`` (from /proc). Ray puts
    each worker in a process group of its own, but every process keeps its session."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # state ppid pgrp session ...
            if fields[0] == "Z" or int(fields[3]) not in sids:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                out[int(entry)] = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, IndexError, ValueError):
            continue
    return out


class Cluster:
    """Head + one more node started with ``ray start``; each node's processes in a session of its own."""

    def __init__(self):
        self.temp_dir = tempfile.mkdtemp(prefix="hray", dir="/tmp")  # Ray's socket paths must stay short
        self.sessions: list[int] = []
        self.address = ""

    def _start(self, args: list[str]) -> None:
        proc = subprocess.Popen([RAY, "start", "--num-cpus=1", f"--temp-dir={self.temp_dir}", "--disable-usage-stats",
                                 *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(),
                                start_new_session=True)
        self.sessions.append(proc.pid)  # its daemons and their workers keep this session
        try:
            out, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            pytest.skip(f"ray start did not return within 120 s: {out[-500:]}")
        if proc.returncode != 0:
            pytest.skip(f"ray start failed (exit {proc.returncode}): {out.strip().splitlines()[-1:]}")

    def start(self) -> None:
        port, dashboard = _free_ports(2)
        self._start(["--head", f"--port={port}", "--node-ip-address=127.0.0.1", "--include-dashboard=false",
                     f"--dashboard-port={dashboard}", *_node_ports()])
        self.address = f"127.0.0.1:{port}"
        self._start([f"--address={self.address}", "--node-ip-address=127.0.0.1", *_node_ports()])
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # wait until the second node has registered
            status = subprocess.run([RAY, "status", f"--address={self.address}"], capture_output=True, text=True,
                                    env=_env(), timeout=60)
            active = status.stdout.split("Pending:")[0]
            if active.count(" node_") >= 2:
                return
            time.sleep(1)
        pytest.skip(f"the second Ray node did not join within 90 s: {status.stdout[-300:]}{status.stderr[-300:]}")

    def worker_pids(self, node: int) -> list[int]:
        """Ray worker processes running a trial on ``node`` (0 head, 1 second node)."""
        return sorted(pid for pid, cmd in _session_pids({self.sessions[node]}).items()
                      if cmd.startswith("ray::ray_trial"))

    def driver_log_mentions(self, text: str) -> bool:
        """True when a driver's core log of this cluster contains ``text``."""
        for log in Path(self.temp_dir).glob("session_*/logs/python-core-driver-*.log"):
            with contextlib.suppress(OSError):
                if text in log.read_text(errors="replace"):
                    return True
        return False

    def stop(self) -> None:
        """SIGTERM every process of the cluster's sessions, SIGKILL what is left after 2 s."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in _session_pids(set(self.sessions)):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline and _session_pids(set(self.sessions)):
                time.sleep(0.2)
            if not _session_pids(set(self.sessions)):
                break
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _rows(path: Path) -> pd.DataFrame:
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    df = df.drop(columns=[c for c in df.columns if c in TIMING])
    return df.sort_values(["variant", "seed"]).reset_index(drop=True)


def test_two_node_cluster_survives_a_worker_killed_mid_trial(tmp_path):
    cluster = Cluster()
    proc = None
    try:
        with ThreadPoolExecutor(1) as pool:  # the nodes start (mostly waiting) while the local run trains
            starting = pool.submit(cluster.start)
            assert cli.main([*RUN, "--jobs", "1", "--results-dir", str(tmp_path), "--run-id", "local",
                             "-q"]) == 0
            starting.result()  # re-raises a skip or failure of the start here
        proc = subprocess.Popen([sys.executable, "-m", "harness", *RUN, "--executor", "ray", "--address",
                                 cluster.address, "--results-dir", str(tmp_path), "--run-id", "ray"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=ROOT)
        killed = None
        deadline = time.monotonic() + 180
        while killed is None and proc.poll() is None and time.monotonic() < deadline:
            pids = cluster.worker_pids(1)
            if pids:
                os.kill(pids[0], signal.SIGKILL)  # mid-trial: the process is titled ray::ray_trial
                killed = pids[0]
            time.sleep(0.05)
        try:
            out, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"the Ray run did not finish within 300 s: {err[-2000:]}")
        resubmitted = cluster.driver_log_mentions("Will resubmit task")
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        cluster.stop()
    assert killed is not None, f"no trial was seen running on the second node: {err[-2000:]}"
    assert resubmitted, "Ray did not retry a task: the kill did not hit a running trial"
    assert proc.returncode == 0, err[-2000:]
    assert f"ray cluster {cluster.address}: 2 CPU(s)" in err
    assert err.count("-> stored in") == 4  # each trial stored once, the retried one included
    assert sorted(p.name for p in (tmp_path / "ray" / "trials").glob("*.json")) == \
        ["baseline__s0.json", "baseline__s1.json", "example_rmsnorm__s0.json", "example_rmsnorm__s1.json"]
    on_ray, local = _rows(tmp_path / "ray" / "trials.csv"), _rows(tmp_path / "local" / "trials.csv")
    assert len(on_ray) == 4 and (on_ray["status"] == "ok").all() and (on_ray["threads"] == "1").all()
    pd.testing.assert_frame_equal(on_ray, local)
    assert cli.main(["verify", str(tmp_path / "ray"), "-q"]) == 0
    assert not _session_pids(set(cluster.sessions)), "the cluster's processes outlived the test"
