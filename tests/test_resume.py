"""A run survives being killed and failing trials.

* SIGKILL after two finished trials, then ``--resume``: every trial stored exactly once, the
  trials stored before the kill untouched (not re-run).
* Ctrl-C (SIGINT) and SIGTERM: exit 130, one message saying how to resume, no traceback. The
  signal is sent while a trial of :data:`BLOCKING_PLUGIN` holds its first training step (an event
  the test waits for, not a sleep), so the run can never finish first.
* A variant that goes NaN, one that raises and one that runs out of memory are recorded with
  status and reason; the other trials are untouched; exit code 1 and the report lists them.
* ``--jobs 2``: a trial that kills its worker process is recorded as failed, the others finish.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

from harness.train import run_trial
from harness.trial import TrialSpec

from .conftest import cli_in_process

ROOT = Path(__file__).resolve().parents[1]
TIMING = {"wall_s", "train_s", "step_ms", "tokens_per_s", "time_to_solve_s", "peak_mem_mb", "overhead_share"}

FAULTY_PLUGIN = '''
"""Components that fail on purpose, for the failure-isolation tests."""
import multiprocessing
import os

import torch
from torch import nn

from harness import Component, Variant, hookimpl


class NaNNorm(nn.Module):
    """Post-norm residual whose output is NaN: the loss goes non-finite at step 1."""

    final_norm = False

    def __init__(self, ctx):
        super().__init__()
        self.norm = ctx.layer_norm()

    def forward(self, x, sublayer):
        return self.norm(x + sublayer(x)) * float("nan")


class RaisingAttention(nn.Module):
    def __init__(self, ctx):
        super().__init__()
        self.w_q = nn.Linear(ctx.cfg.d_model, ctx.cfg.d_model)

    def forward(self, query, key, value, mask):
        raise RuntimeError("attention exploded on purpose")


class OOMAttention(RaisingAttention):
    def forward(self, query, key, value, mask):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (simulated)")


def die_in_worker(ctx):
    if multiprocessing.parent_process() is not None:
        os._exit(9)  # as if the out-of-memory killer struck
    raise RuntimeError("kills_worker only dies inside a worker process")


@hookimpl
def harness_add_components():
    return [Component("nan", "norm", NaNNorm, "returns NaN"),
            Component("raises", "attention", RaisingAttention, "raises RuntimeError"),
            Component("oom", "attention", OOMAttention, "raises torch.OutOfMemoryError"),
            Component("dies", "attention", die_in_worker, "kills its worker process")]


@hookimpl
def harness_add_variants():
    return [Variant("goes_nan", {"norm": "nan"}), Variant("raises", {"attention": "raises"}),
            Variant("ooms", {"attention": "oom"}), Variant("kills_worker", {"attention": "dies"})]
'''


BLOCKING_PLUGIN = '''
"""A variant whose first training step announces itself and then waits (for the test's signal)."""
import os
import time
from pathlib import Path

import torch
from torch import nn

from harness import Component, Variant, hookimpl


class BlockingNorm(nn.Module):
    """Post-norm residual that, in its first training forward, creates ``$BLOCK_DIR/<pid>`` and
    then sleeps until ``$BLOCK_DIR/release`` exists (at most 120 s, so a lost signal fails the
    test instead of hanging it)."""

    final_norm = False

    def __init__(self, ctx):
        super().__init__()
        self.norm = ctx.layer_norm()

    def forward(self, x, sublayer):
        if self.training and torch.is_grad_enabled():
            block_dir = Path(os.environ["BLOCK_DIR"])
            (block_dir / str(os.getpid())).touch()
            deadline = time.monotonic() + 120
            while not (block_dir / "release").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        return self.norm(x + sublayer(x))


@hookimpl
def harness_add_components():
    return [Component("blocks", "norm", BlockingNorm, "waits in its first training step")]


@hookimpl
def harness_add_variants():
    return [Variant("blocks", {"norm": "blocks"})]
'''


def _env() -> dict:
    return {**os.environ, "HARNESS_DISABLE_PLUGIN_AUTOLOAD": "1",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def harness_cli(*args: str, timeout: float = 300, **env_extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True,
                          timeout=timeout, env={**_env(), **env_extra}, cwd=ROOT)


def _default_sigint() -> None:
    """In the child before exec: SIGINT back to its default. A shell starts background jobs with
    SIGINT ignored, children inherit that, and Python then installs no KeyboardInterrupt handler:
    under ``pytest ... &`` (CI) a Ctrl-C test would otherwise run every trial and exit 0."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(*args: str, **env_extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "harness", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**_env(), **env_extra}, cwd=ROOT,
                            preexec_fn=_default_sigint)


def wait_for_trials(run: Path, n: int, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while len(list((run / "trials").glob("*.json"))) < n:
        if proc.poll() is not None:
            pytest.fail(f"run ended before {n} trials were stored: {proc.stderr.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no {n} trials stored after {timeout} s")
        time.sleep(0.05)


def blocking_run(tmp_path: Path, variants: str, *extra: str) -> tuple[subprocess.Popen, Path, Path]:
    """Start ``run --variants VARIANTS`` with :data:`BLOCKING_PLUGIN` (run id ``stopped``); returns
    the process, its run folder and the plugin's ``BLOCK_DIR``."""
    plugin, block_dir = tmp_path / "blocking_plugin.py", tmp_path / "block"
    plugin.write_text(textwrap.dedent(BLOCKING_PLUGIN))
    block_dir.mkdir()
    proc = start("--plugin", str(plugin), "run", "--variants", variants, "--preset", "tiny", "--results-dir",
                 str(tmp_path), "--run-id", "stopped", *extra, BLOCK_DIR=str(block_dir))
    return proc, tmp_path / "stopped", block_dir


def wait_until_blocked(block_dir: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    """Wait until a ``blocks`` trial waits in its first training step."""
    deadline = time.monotonic() + timeout
    while not any(p.name != "release" for p in block_dir.iterdir()):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the blocking trial never started: {proc.communicate()[1][-2000:]}")
        time.sleep(0.05)


def comparable(row: dict) -> str:
    """A row without its timing columns, as JSON (so that NaN equals NaN)."""
    return json.dumps({k: v for k, v in row.items() if k not in TIMING and k != "traceback"}, sort_keys=True)


def read_rows(path: Path) -> dict[str, dict]:
    return {r["variant"]: r for r in pd.read_csv(path, dtype=str, keep_default_na=False).to_dict("records")}


def stored(run: Path) -> dict[str, bytes]:
    return {p.stem: p.read_bytes() for p in (run / "trials").glob("*.json")}


def _state(pid: int) -> str | None:
    """Process state letter from /proc (``Z`` zombie), None when the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def descendants(pid: int) -> list[int]:
    """Live descendants of ``pid`` (Linux /proc), e.g. the pool's fork server and workers."""
    parent = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            parent[int(stat.parent.name)] = int(fields[1])
    out, frontier = [], [pid]
    while frontier:
        frontier = [c for c, pp in parent.items() if pp in frontier]
        out += frontier
    return out


def test_sigkill_then_resume_runs_each_trial_exactly_once(tmp_path):
    """SIGKILL a ``--jobs 2`` run once baseline and seed_001 are stored and ``blocks`` waits in its
    first step: none lost, no worker left running, and ``--resume`` runs exactly the missing one."""
    proc, run, block_dir = blocking_run(tmp_path, "baseline,seed_001,blocks", "--jobs", "2", "-q")
    wait_for_trials(run, 2, proc)
    wait_until_blocked(block_dir, proc)
    has_proc = Path("/proc/self/stat").exists()
    workers = descendants(proc.pid) if has_proc else []
    assert workers or not has_proc
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 15
    while any(_state(w) not in (None, "Z") for w in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [w for w in workers if _state(w) not in (None, "Z")]
    assert not left, f"worker processes outlived the killed run: {left}"
    before = stored(run)
    planned = [t["key"] for t in json.loads((run / "config.json").read_text())["trials"]]
    assert len(planned) == 3 and sorted(before) == ["baseline__s0", "seed_001__s0"]  # killed mid-run
    for text in before.values():  # atomic writes: every stored trial is complete
        assert json.loads(text)["row"]["status"] == "ok"

    (block_dir / "release").touch()  # the resumed blocks trial trains through
    res = harness_cli("run", "--resume", str(run), BLOCK_DIR=str(block_dir))
    assert res.returncode == 0, res.stderr
    assert f"{len(before)} of {len(planned)} trial(s) stored, running the {len(planned) - len(before)} missing" \
        in res.stderr
    after = stored(run)
    assert sorted(after) == sorted(planned)  # every trial, none twice (one file per key)
    assert {k: after[k] for k in before} == before  # trials lost: 0, and none re-run
    df = pd.read_csv(run / "trials.csv")
    assert len(df) == len(planned) and not df.duplicated(["variant", "seed", "point"]).any()
    assert (df["status"] == "ok").all()
    meta = json.loads((run / "config.json").read_text())
    assert meta["resumes"][0]["missing"] == len(planned) - len(before)
    assert "Partial run" not in (run / "report.md").read_text() and "PARTIAL RUN" not in res.stdout


@pytest.mark.parametrize("sig, extra", [(signal.SIGINT, []), (signal.SIGTERM, ["--jobs", "2"])],
                         ids=["ctrl-c-sequential", "sigterm-jobs-2"])
def test_interrupt_stops_cleanly_with_resume_hint(tmp_path, sig, extra):
    """baseline then ``blocks`` (seed-major; side by side with ``--jobs 2``): the signal is sent once
    baseline is stored and ``blocks`` waits in its first step, so exactly 1 of 2 trials is stored."""
    proc, run, block_dir = blocking_run(tmp_path, "baseline,blocks", *extra)
    wait_for_trials(run, 1, proc)
    wait_until_blocked(block_dir, proc)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert sorted(stored(run)) == ["baseline__s0"]
    what = "interrupted" if sig == signal.SIGINT else "terminated (SIGTERM)"
    assert last == f"harness: {what}; 1 of 2 trial(s) are stored in {run}; resume with: python -m harness run " \
                   f"--resume {run}"
    assert json.loads((run / "config.json").read_text())["status"] == "interrupted"
    banner = f"1 of 2 planned trials done** (interrupted); every table, plot and verdict below covers only those. " \
             f"Resume: `python -m harness run --resume {run}`"
    assert (run / "report.md").read_text().splitlines()[2] == "> **Partial run: " + banner  # report.md says so first
    assert out.startswith("PARTIAL RUN: 1 of 2 planned trials done (interrupted)"), out  # and so does the terminal
    if extra:  # the pool's workers (the blocked one included) are gone with the run
        assert not [p for p in block_dir.iterdir() if _state(int(p.name)) not in (None, "Z")]


def test_nan_raise_and_oom_trials_are_isolated(tmp_path):
    plugin = tmp_path / "faulty_plugin.py"
    plugin.write_text(textwrap.dedent(FAULTY_PLUGIN))
    res = cli_in_process("--plugin", str(plugin), "run", "--variants", "baseline,goes_nan,raises,ooms,pre_norm",
                         "--preset", "tiny", "--results-dir", str(tmp_path), "--run-id", "faulty")
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr
    assert "3 of 5 trial(s) did not finish ok" in res.stderr
    assert f"--resume {tmp_path / 'faulty'} --retry-failed" in res.stderr  # two crashed: a retry may help
    run = tmp_path / "faulty"
    rows = read_rows(run / "trials.csv")
    # NaN from the first forward: the run gate's finite probe fails at initialisation (invalid, never
    # ranked), and the training loop's own stop is kept in the reason
    assert rows["goes_nan"]["status"] == "invalid" and "non-finite loss at step 1" in rows["goes_nan"]["reason"]
    assert "at initialisation: " in rows["goes_nan"]["reason"]
    assert rows["raises"]["status"] == "failed"
    assert rows["raises"]["reason"] == "RuntimeError: attention exploded on purpose"
    assert rows["ooms"]["status"] == "failed" and rows["ooms"]["reason"].startswith("OutOfMemoryError: CUDA out of")
    report = (run / "report.md").read_text()
    assert "goes_nan" in report.split("## Invalid variants", 1)[1].split("##", 1)[0]
    for name in ("raises", "ooms"):
        assert name in report.split("## Failures", 1)[-1], f"{name} missing from the report's failures"
    # the others are untouched: identical to the same trial run on its own
    meta = json.loads((run / "config.json").read_text())
    for t in meta["trials"]:
        if t["spec"]["variant"] in ("baseline", "pre_norm"):
            alone = run_trial(TrialSpec.from_dict(t["spec"])).row
            got = json.loads((run / "trials" / f"{t['key']}.json").read_text())["row"]
            assert alone["status"] == got["status"] == "ok"
            assert comparable(got) == comparable(alone)
    # failed trials are stored trials: resuming runs nothing and still exits 1
    before = stored(run)
    again = cli_in_process("run", "--resume", str(run))
    assert again.returncode == 1, again.stderr
    assert "nothing to run: all 5 trial(s)" in again.stderr
    assert stored(run) == before


def test_worker_that_dies_is_recorded_and_the_pool_goes_on(tmp_path):
    plugin = tmp_path / "faulty_plugin.py"
    plugin.write_text(textwrap.dedent(FAULTY_PLUGIN))
    res = cli_in_process("--plugin", str(plugin), "run", "--variants", "baseline,kills_worker,pre_norm,seed_001",
                         "--preset", "tiny", "--jobs", "2", "--results-dir", str(tmp_path), "--run-id", "pool", "-q")
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr
    rows = read_rows(tmp_path / "pool" / "trials.csv")
    assert sorted(rows) == ["baseline", "kills_worker", "pre_norm", "seed_001"]
    assert rows["kills_worker"]["status"] == "failed"
    assert "worker process died" in rows["kills_worker"]["reason"]
    assert all(rows[v]["status"] == "ok" for v in ("baseline", "pre_norm", "seed_001"))


def test_a_group_whose_worker_dies_is_recorded_and_the_pool_goes_on(tmp_path):
    """``--vectorise-seeds on --jobs 2``: a trial group whose worker dies (again in a worker of its own) has
    every seed recorded ``failed``; the other groups finish."""
    plugin = tmp_path / "faulty_plugin.py"
    plugin.write_text(textwrap.dedent(FAULTY_PLUGIN))
    res = cli_in_process("--plugin", str(plugin), "run", "--variants", "baseline,kills_worker,pre_norm", "--seeds", "2",
                         "--preset", "tiny", "--jobs", "2", "--vectorise-seeds", "on", "--results-dir", str(tmp_path),
                         "--run-id", "groups", "-q")
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr
    df = pd.read_csv(tmp_path / "groups" / "trials.csv")
    assert len(df) == 6
    dead = df[df["variant"] == "kills_worker"]
    assert list(dead["status"]) == ["failed", "failed"] and dead["reason"].str.contains("worker process died").all()
    assert (df[df["variant"] != "kills_worker"]["status"] == "ok").all()
    pools = [ln for ln in (tmp_path / "groups" / "log.txt").read_text().splitlines() if ln.startswith("pool: ")]
    assert pools and all(re.fullmatch(r"pool: [12] worker process\(es\); the first trial group began \d+\.\d s "
                                      r"after the pool opened", ln) for ln in pools), pools  # the workers' start


GRAD_NORM_EXPERIMENT = """
description = "grad norm at init, killed and resumed"
kind = "grad_norm_at_init"
variants = ["baseline", "blocks"]
seeds = 1
preset = "tiny"
[sweep]
N = [1, 2]
[measure]
batches = 1
"""


def test_measurement_experiment_takes_the_lock_stops_on_sigterm_and_resumes(tmp_path):
    """A ``grad_norm_at_init`` experiment is an ordinary run (``launch.drive``): while it runs it
    holds the run lock; with ``--jobs 1`` (the jobs asked for, not a fixed 1), SIGTERM while ``blocks`` waits in its first measurement (its first
    training-mode forward) stops it as ``interrupted`` with the resume hint; ``--resume`` measures
    the 3 missing trials (with the stored execution options, as any run) and renders the slope report."""
    from harness.store import RunStore

    plugin, block_dir, exp = tmp_path / "blocking_plugin.py", tmp_path / "block", tmp_path / "gn_stop.toml"
    plugin.write_text(textwrap.dedent(BLOCKING_PLUGIN))
    exp.write_text(GRAD_NORM_EXPERIMENT)
    block_dir.mkdir()
    proc = start("--plugin", str(plugin), "run", "--experiment", str(exp), "--results-dir", str(tmp_path),
                 "--run-id", "gn", "--device", "cpu", "--jobs", "1", BLOCK_DIR=str(block_dir))
    run = tmp_path / "gn"
    wait_for_trials(run, 1, proc)
    wait_until_blocked(block_dir, proc)
    assert RunStore.open(run).is_locked()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == (f"harness: terminated (SIGTERM); 1 of 4 trial(s) are stored in {run}; "
                                            f"resume with: python -m harness run --resume {run}")
    meta = json.loads((run / "config.json").read_text())
    assert meta["status"] == "interrupted" and meta["kind"] == "grad_norm_at_init"
    assert all(t["spec"]["measure"]["kind"] == "grad_norm_at_init" for t in meta["trials"])
    assert sorted(stored(run)) == ["baseline__N=1__s0"]

    (block_dir / "release").touch()
    res = harness_cli("run", "--resume", str(run), BLOCK_DIR=str(block_dir))  # plugins and --jobs 1 as stored
    assert res.returncode == 0, res.stderr
    assert "1 of 4 trial(s) stored, running the 3 missing" in res.stderr
    assert len(stored(run)) == 4
    meta = json.loads((run / "config.json").read_text())
    assert meta["status"] == "complete" and meta["execution"]["jobs"] == meta["resumes"][0]["execution"]["jobs"] == 1
    assert "slope of log" in res.stdout  # the measurement's slope table, not a training summary
    assert "## Log-log slopes" in (run / "report.md").read_text()


def test_a_run_stored_before_a_config_key_was_added_still_resumes():
    """The committed task-sort run predates ``model.n_kv_heads`` and ``model.window``: its trials'
    configs lack them, this code's configs hold them at their defaults. That reads the same (the
    config hash ignores an added key at its default), so resuming is allowed; a real difference
    in a trial's config is still refused, naming the field."""
    import dataclasses

    from harness.errors import StoreError
    from harness.resume import check_code_config, stored_specs
    from harness.store import RunStore

    store = RunStore.open(ROOT / "results" / "reference" / "task-sort")
    meta = store.meta()
    specs = stored_specs(store, meta)
    assert specs and all("n_kv_heads" not in ts.config["model"] for ts in specs)  # the premise
    check_code_config(store, meta, specs)  # raised "model.n_kv_heads: stored '<unset>', requested 0" before
    changed = {**specs[0].config, "model": {**specs[0].config["model"], "h": "four"}}
    with pytest.raises(StoreError, match="h must be int"):
        check_code_config(store, meta, [dataclasses.replace(specs[0], config=changed)])
