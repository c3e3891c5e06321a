"""Time limits and resource errors of a run (``harness.executors.limits``, ``launch.drive``'s handling, docs/running.md).

* ``--trial-timeout``: a trial whose forward hangs after a few training steps (:data:`HANG_PLUGIN`) is
  ended in its worker process and stored ``timed_out`` with the step it reached, beside a normal
  trial that finishes ``ok``; exit 1; ``--resume --retry-failed`` plans it again. A vectorised trial
  group past its limit has every seed ``timed_out``.
* ``--time-budget``: once spent, the running trial is ended as ``timed_out`` and the unstarted ones
  stay missing (status ``out_of_time``, the partial banner and the resume command, exit 1).
* A full disk (``ENOSPC`` on the second trial file's fsync): one line, exit 1, no traceback, the first
  trial's file intact, no temp file left, and ``--resume`` finishes the run.
* A trial that raises ``MemoryError`` fails with a reason that says "out of memory"; the run goes on.
"""
from __future__ import annotations

import errno
import json
import os
import re
import textwrap

import pytest

from harness.launch import retire_failed
from harness.resume import stored_specs
from harness.store import RunStore
from harness.trial import read_trial_file

from .conftest import cli_in_process

HANG_PLUGIN = '''
"""``a_hangs``: a post-norm residual whose forward sleeps for an hour from the third training step on
(a forward called from the training loop's ``train_step`` or a trial group's step, ``harness/vstep.py``), while ``<this file>.hang`` exists: the gate's
forwards pass. ``a_ooms``: one that raises ``MemoryError()`` in training while ``<this file>.oom`` exists."""
import sys
import time
from pathlib import Path

import torch
from torch import nn

from harness import Component, Variant, hookimpl

HANG, OOM = Path(__file__).with_suffix(".hang"), Path(__file__).with_suffix(".oom")
CALLS = [0]


class Residual(nn.Module):
    final_norm = False

    def __init__(self, ctx):
        super().__init__()
        self.norm = ctx.layer_norm()

    def forward(self, x, sublayer):
        return self.norm(x + sublayer(x))


def in_train_step() -> bool:
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_name != "train_step" and not frame.f_code.co_filename.endswith("vstep.py"):
        frame = frame.f_back
    return frame is not None


class Hangs(Residual):
    def forward(self, x, sublayer):
        if in_train_step() and HANG.exists():
            CALLS[0] += 1
            if CALLS[0] > 10:  # a few training steps in (5 residuals a step at N=1)
                time.sleep(3600)
        return super().forward(x, sublayer)


class Ooms(Residual):
    def forward(self, x, sublayer):
        if self.training and torch.is_grad_enabled() and OOM.exists():
            raise MemoryError()
        return super().forward(x, sublayer)


@hookimpl
def harness_add_components():
    return [Component("hangs", "norm", Hangs, "hangs in training"),
            Component("ooms", "norm", Ooms, "runs out of memory in training")]


@hookimpl
def harness_add_variants():
    return [Variant("a_hangs", {"norm": "hangs"}), Variant("a_ooms", {"norm": "ooms"})]
'''

#: A short trial: four steps, one evaluation of a few sequences.
SHORT = ("--preset", "tiny", "--set", "train.steps=4", "--set", "train.eval_every=4", "--set", "train.eval_sequences=16",
         "--device", "cpu", "--no-check", "-q")


@pytest.fixture
def plugin(tmp_path):
    path = tmp_path / "hang_plugin.py"
    path.write_text(textwrap.dedent(HANG_PLUGIN))
    return path


def rows(run) -> dict:
    return {t.row["variant"]: t.row for t in RunStore.open(run).load_trials()}


def test_a_hung_trial_is_ended_as_timed_out_and_the_others_finish(tmp_path, plugin):
    plugin.with_suffix(".hang").touch()
    res = cli_in_process("--plugin", plugin, "run", "--variants", "a_hangs", "baseline", *SHORT, "--jobs", "2",
                         "--trial-timeout", "10", "--results-dir", tmp_path, "--run-id", "t")
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr
    run = tmp_path / "t"
    got = rows(run)
    assert got["baseline"]["status"] == "ok"
    hung = got["a_hangs"]
    assert hung["status"] == "timed_out", hung
    m = re.fullmatch(r"trial exceeded --trial-timeout 10 s at step (\d+) of 4; its worker process was ended",
                     hung["reason"])
    assert m and int(m.group(1)) >= 2, hung["reason"]  # it hung in training, after the steps before
    assert 10 <= hung["wall_s"] < 60
    assert "a_hangs s0 timed_out" in res.stderr and "--retry-failed" in res.stderr
    meta = json.loads((run / "config.json").read_text())
    assert meta["execution"]["trial_timeout"] == 10 and meta["status"] == "complete"
    assert "timed_out" in (run / "trials.csv").read_text()
    # --resume --retry-failed plans the timed-out trial again (and only it)
    store = RunStore.open(run)
    assert retire_failed(store, stored_specs(store, store.meta())) == ["a_hangs__s0"]
    assert store.missing(["a_hangs__s0", "baseline__s0"]) == ["a_hangs__s0"]
    assert (run / "trials" / "retried" / "a_hangs__s0.json").is_file()


def test_a_vectorised_group_past_its_limit_has_every_seed_timed_out(tmp_path, plugin):
    plugin.with_suffix(".hang").touch()
    res = cli_in_process("--plugin", plugin, "run", "--variants", "a_hangs", "baseline", "--seeds", "2", *SHORT,
                         "--vectorise-seeds", "on", "--jobs", "2", "--trial-timeout", "10", "--results-dir", tmp_path,
                         "--run-id", "g")
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    got = {(t.row["variant"], t.row["seed"]): t.row for t in RunStore.open(tmp_path / "g").load_trials()}
    assert [got[("baseline", s)]["status"] for s in (0, 1)] == ["ok", "ok"]
    for s in (0, 1):
        assert got[("a_hangs", s)]["status"] == "timed_out"
        assert got[("a_hangs", s)]["reason"].startswith("trial exceeded --trial-timeout 10 s at step ")


def test_a_spent_time_budget_ends_the_running_trial_and_leaves_the_rest_unstarted(tmp_path, plugin):
    plugin.with_suffix(".hang").touch()
    res = cli_in_process("--plugin", plugin, "run", "--variants", "a_hangs", "baseline", *SHORT, "--jobs", "1",
                         "--time-budget", "6", "--results-dir", tmp_path, "--run-id", "b")
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr
    run = tmp_path / "b"
    got = rows(run)
    assert "baseline" not in got  # never started: it stays missing, for --resume
    if "a_hangs" in got:  # ended when the budget was spent (unless the budget ran out before it started)
        assert got["a_hangs"]["status"] == "timed_out"
        assert "when the run's --time-budget of 6 s was spent" in got["a_hangs"]["reason"]
    meta = json.loads((run / "config.json").read_text())
    assert meta["status"] == "out_of_time" and meta["execution"]["time_budget"] == 6
    assert f"finish with: python -m harness run --resume {run}" in res.stderr
    assert res.stdout.startswith("PARTIAL RUN: ") and "its --time-budget was spent" in res.stdout
    verify = cli_in_process("verify", run)
    assert "spent its --time-budget" in verify.stdout + verify.stderr


def test_time_limits_are_refused_where_they_cannot_hold(tmp_path):
    for args, msg in [(("--trial-timeout", "0"), "expected a positive number of seconds, got '0'"),
                      (("--time-budget", "nan"), "expected a positive number of seconds, got 'nan'"),
                      (("--trial-timeout", "5", "--executor", "ray"), "cannot be used with --executor ray")]:
        res = cli_in_process("run", "--variants", "baseline", "--preset", "tiny", *args, "--results-dir", tmp_path)
        assert res.returncode == 2 and msg in res.stderr and "Traceback" not in res.stderr, res.stderr
        assert not any(tmp_path.iterdir())  # nothing stored


def test_a_full_disk_stops_the_run_in_one_line_and_keeps_what_is_stored(tmp_path, monkeypatch):
    import harness.store as store_mod

    real_write, real_fsync, calls, failing = store_mod.RunStore.write_trial, os.fsync, [], [False]

    def write_trial(self, key, result):  # the second trial's file meets a full disk
        calls.append(key)
        failing[0] = len(calls) == 2
        try:
            return real_write(self, key, result)
        finally:
            failing[0] = False

    def fsync(fd):
        if failing[0]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    monkeypatch.setattr(store_mod.RunStore, "write_trial", write_trial)
    monkeypatch.setattr(store_mod.os, "fsync", fsync)
    res = cli_in_process("run", "--variants", "baseline", "pre_norm", *SHORT, "--jobs", "1",
                         "--results-dir", tmp_path, "--run-id", "full")
    run = tmp_path / "full"
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines == [f"harness: error: no space left on device writing {run / 'trials' / 'pre_norm__s0.json'}; "
                     f"1 of 2 trial(s) are stored in {run}; free space (or fix the permissions), then resume with: "
                     f"python -m harness run --resume {run}"], res.stderr
    assert sorted(p.name for p in (run / "trials").iterdir()) == ["baseline__s0.json"]  # no temp file left
    assert read_trial_file(run / "trials" / "baseline__s0.json")["row"]["status"] == "ok"
    assert json.loads((run / "config.json").read_text())["status"] == "stopped"
    monkeypatch.undo()
    again = cli_in_process("run", "--resume", run, "-q")
    assert again.returncode == 0, again.stderr
    assert sorted(rows(run)) == ["baseline", "pre_norm"]


def test_a_trial_out_of_memory_fails_with_that_reason_and_the_run_goes_on(tmp_path, plugin):
    plugin.with_suffix(".oom").touch()
    res = cli_in_process("--plugin", plugin, "run", "--variants", "a_ooms", "baseline", *SHORT, "--jobs", "1",
                         "--results-dir", tmp_path, "--run-id", "m")
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    got = rows(tmp_path / "m")
    assert got["a_ooms"]["status"] == "failed" and got["a_ooms"]["reason"] == "MemoryError: out of memory"
    assert got["baseline"]["status"] == "ok"
