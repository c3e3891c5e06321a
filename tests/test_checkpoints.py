"""Mid-trial checkpoints (harness/checkpoint.py): an interrupted trial continues from its
checkpoint on ``--resume`` and ends bitwise equal to an uninterrupted one on the CPU (times aside).

* Ctrl-C (a real SIGINT) while a trial of :data:`HOLDING_PLUGIN` holds a training step: the run
  exits 130 with a checkpoint of that step; ``--resume`` continues the trial from it; rows, curves
  and saved weights equal an uninterrupted run's; the checkpoint is gone once the trial is stored.
* A KeyboardInterrupt in the middle of a step (not at a boundary): the last periodic checkpoint is
  used, and the result is the same.
* A checkpoint of another config, of other threads, or a truncated file is not used (a note says
  why) and the trial equals a fresh one.
* Worker processes (``--jobs 2``) write theirs under the run folder; ``--keep-checkpoints`` keeps them.
* Vectorised groups checkpoint as one unit: ``tests/test_group_checkpoints.py``.
"""
from __future__ import annotations

import dataclasses
import io
import json
import os
import signal
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from harness.checkpoint import Checkpointer, checkpoint_path
from harness.config import get_preset
from harness.errors import ConfigError
from harness.train import run_trial
from harness.trial import TrialSpec

from .conftest import cli_in_process

TIMES = {"wall_s", "train_s", "step_ms", "tokens_per_s", "time_to_solve_s", "peak_mem_mb", "overhead_share",
         "resumed_from_step", "checkpoint_note"}

#: A variant whose ``HOLD_AT``-th training forward (grad on) creates ``$HOLD_DIR/held`` and waits
#: until ``$HOLD_DIR/release`` exists (at most 120 s): the test sends its SIGINT while a step is held.
HOLDING_PLUGIN = '''
import os
import time
from pathlib import Path

import torch
from torch import nn

from harness import Component, Variant, hookimpl


class HoldingNorm(nn.Module):
    final_norm = False

    def __init__(self, ctx):
        super().__init__()
        self.norm = ctx.layer_norm()
        self.calls = 0

    def forward(self, x, sublayer):
        if self.training and torch.is_grad_enabled():
            self.calls += 1
            folder = Path(os.environ["HOLD_DIR"])
            if self.calls == int(os.environ["HOLD_AT"]) and not (folder / "release").exists():
                (folder / "held").touch()
                deadline = time.monotonic() + 120
                while not (folder / "release").exists() and time.monotonic() < deadline:
                    time.sleep(0.02)
        return self.norm(x + sublayer(x))


@hookimpl
def harness_add_components():
    return [Component("holds", "norm", HoldingNorm, "holds one training forward until released")]


@hookimpl
def harness_add_variants():
    return [Variant("holds", {"norm": "holds"})]
'''


def same(a, b) -> bool:
    """Equal as JSON (NaN equals NaN; -0.0 and 0.0 differ), every float to the bit."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def comparable(result: dict) -> dict:
    """A stored trial without its times: the row, the curve (no ``wall_s``) and the phases' calls."""
    row = {k: v for k, v in result["row"].items() if k not in TIMES}
    curve = [{k: v for k, v in r.items() if k != "wall_s"} for r in result["curve"]]
    return {"row": row, "curve": curve}


def trial_file(run: Path, key: str) -> dict:
    return json.loads((run / "trials" / f"{key}.json").read_text())


def weights(run: Path, key: str) -> dict:
    return torch.load(run / "models" / f"{key}.pt", weights_only=True)


def assert_same_weights(a, b) -> None:
    """Two state_dicts (or their serialised bytes, as a result carries them) equal tensor by tensor."""
    a, b = (torch.load(io.BytesIO(x), weights_only=True) if isinstance(x, bytes) else x for x in (a, b))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def run_args(tmp_path: Path, run_id: str, *extra) -> list[str]:
    return ["--plugin", str(tmp_path / "holding.py"), "run", "--variants", "holds", "--preset", "tiny",
            "--device", "cpu", "--no-check", "--jobs", "1", "--threads", "1", "--save-models",
            "--set", "train.steps=40", "--set", "train.eval_every=15", "--set", "train.checkpoint_every=6",
            "--results-dir", str(tmp_path), "--run-id", run_id, *extra]


def test_ctrl_c_mid_trial_then_resume_equals_an_uninterrupted_run(tmp_path, monkeypatch, python_ctrl_c):
    (tmp_path / "holding.py").write_text(textwrap.dedent(HOLDING_PLUGIN))
    hold = tmp_path / "hold"
    hold.mkdir()
    monkeypatch.setenv("HOLD_DIR", str(hold))
    monkeypatch.setenv("HOLD_AT", "1000000")  # the uninterrupted run never holds
    whole = cli_in_process(*run_args(tmp_path, "whole"))
    assert whole.returncode == 0, whole.stderr
    assert not (tmp_path / "whole" / "checkpoints").exists()  # removed once the trial was stored

    monkeypatch.setenv("HOLD_AT", "23")  # a forward of a step between the periodic checkpoints

    def interrupt():
        deadline = time.monotonic() + 240
        while not (hold / "held").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the step is held ...
        while signal.getsignal(signal.SIGINT) is not signal.default_int_handler and time.monotonic() < deadline:
            time.sleep(0.02)  # ... until the loop's handler took it (and gave Ctrl-C back to Python) ...
        (hold / "release").touch()  # ... then the step ends: its checkpoint is written, then the run stops

    sender = threading.Thread(target=interrupt, daemon=True)
    sender.start()
    stopped = cli_in_process(*run_args(tmp_path, "stopped"))
    sender.join()
    assert stopped.returncode == 130, stopped.stderr
    assert "Traceback" not in stopped.stderr
    run = tmp_path / "stopped"
    ckpt = checkpoint_path(run / "checkpoints", "holds__s0")
    step = torch.load(ckpt, weights_only=True)["step"]
    assert 1 < step < 40 and step % 6 != 0  # written at the interrupted step, not a periodic one
    assert not list((run / "trials").glob("*.json"))

    (run / "checkpoints" / "holds__s0.pt.99999.tmp").write_bytes(b"half a checkpoint of a killed writer")
    resumed = cli_in_process("run", "--resume", str(run), "--save-models")
    assert resumed.returncode == 0, resumed.stderr
    stored = trial_file(run, "holds__s0")
    assert stored["row"]["resumed_from_step"] == step
    assert f"continued from its checkpoint at step {step}" in resumed.stderr
    assert same(comparable(stored), comparable(trial_file(tmp_path / "whole", "holds__s0")))
    assert_same_weights(weights(run, "holds__s0"), weights(tmp_path / "whole", "holds__s0"))
    assert not (run / "checkpoints").exists()


def tiny_spec(folder: Path, **train) -> TrialSpec:
    # a curve row every 5 steps: the checkpoints at steps 4, 8, 12, 16 hold losses not yet in a row
    cfg = get_preset("tiny").override({"train.steps": 30, "train.eval_every": 10, "train.checkpoint_every": 4,
                                       "train.log_every": 5,
                                       **{f"train.{k}": v for k, v in train.items()}})
    return TrialSpec("baseline", 0, cfg.to_dict(), device="cpu", threads=1, save_model=True,
                     checkpoint_dir=str(folder))


def interrupted_at(spec: TrialSpec, step: int) -> None:
    """Run ``spec`` and raise KeyboardInterrupt from inside step ``step`` (its progress call, before
    the step's periodic evaluation and checkpoint): not a step boundary."""
    def progress(s, loss):
        if s == step:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        run_trial(spec, progress=progress)


def plain(result) -> dict:
    return comparable(result.to_dict())


def test_interrupt_inside_a_step_resumes_from_the_last_periodic_checkpoint(tmp_path):
    spec = tiny_spec(tmp_path)
    reference = run_trial(dataclasses.replace(spec, checkpoint_dir=""))
    assert not list(tmp_path.iterdir())  # no folder, no checkpoint
    interrupted_at(spec, 18)
    assert torch.load(checkpoint_path(tmp_path, spec.key), weights_only=True)["step"] == 16
    again = run_trial(spec)
    assert again.row["resumed_from_step"] == 16 and "checkpoint_note" not in again.row
    assert same(plain(again), plain(reference))
    assert_same_weights(again.extra["weights"], reference.extra["weights"])


@pytest.mark.parametrize("change", ["config", "truncated"])
def test_a_checkpoint_of_another_trial_is_not_used(tmp_path, change):
    spec = tiny_spec(tmp_path)
    interrupted_at(spec, 9)
    ckpt = checkpoint_path(tmp_path, spec.key)
    assert ckpt.is_file()
    if change == "config":  # same key, another learning rate: the checkpoint's weights would be wrong
        other = tiny_spec(tmp_path, noam_factor=0.5)
    else:
        ckpt.write_bytes(ckpt.read_bytes()[:200])
        other = spec
    result = run_trial(other)
    fresh = run_trial(dataclasses.replace(other, checkpoint_dir=""))
    assert "resumed_from_step" not in result.row
    expected = {"config": "written for another trial (spec.config.train.noam_factor", "truncated": "unreadable"}
    assert f"checkpoint {spec.key}.pt not used: {expected[change]}" in result.row["checkpoint_note"]
    assert same(plain(result), plain(fresh))


@pytest.mark.parametrize("change", [{"threads": 2}, {"dtype": "bf16"}, {"save_model": False}])
def test_what_a_checkpoint_must_match(tmp_path, change):
    """Other threads reduce in another order (not the same trial bit for bit): not used; whether the
    weights are saved does not change the training: used."""
    spec = tiny_spec(tmp_path)
    interrupted_at(spec, 9)
    saver = Checkpointer(dataclasses.replace(spec, **change), get_preset("tiny"), torch.device("cpu"))
    state = saver.load()
    if "save_model" in change:
        assert state is not None and state["step"] == 8 and not saver.notes
    else:
        name = next(iter(change))
        assert state is None and f"written for another trial (spec.{name}: checkpoint" in saver.notes["checkpoint_note"]


def test_workers_write_checkpoints_under_the_run_and_keep_checkpoints_keeps_them(tmp_path):
    out = cli_in_process("run", "--variants", "baseline", "--preset", "tiny", "--seeds", "2", "--device", "cpu",
                         "--no-check", "--jobs", "2", "--set", "train.steps=12", "--set", "train.checkpoint_every=5",
                         "--keep-checkpoints", "--results-dir", tmp_path, "--run-id", "kept")
    assert out.returncode == 0, out.stderr
    folder = tmp_path / "kept" / "checkpoints"
    for seed in (0, 1):
        state = torch.load(checkpoint_path(folder, f"baseline__s{seed}"), weights_only=True)
        assert state["step"] == 10 and state["identity"]["spec"]["seed"] == seed
    assert not list(folder.glob("*.tmp"))


@pytest.mark.parametrize("value", [True, -1, 2.5, "soon", "-5s", "infs"])
def test_bad_checkpoint_every_is_one_line(value):
    with pytest.raises(ConfigError, match="checkpoint_every must be"):
        get_preset("tiny").override({"train.checkpoint_every": value})
