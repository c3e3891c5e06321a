"""Checkpoints of vectorised trial groups (harness/vcheckpoint.py): an interrupted group continues from its
group checkpoint on ``--resume`` and ends bitwise equal to an uninterrupted group on the CPU (times aside).

* Ctrl-C (a real SIGINT) while a group of 3 seeds holds a training step: the run exits 130 with the
  group's checkpoint of that step; ``--resume`` continues the group; trials.csv, curves and saved
  weights equal an uninterrupted ``--vectorise-seeds on`` run's; the checkpoint is gone once stored.
* A KeyboardInterrupt inside a step (dropout on; a seed that diverged before the checkpoint and is not
  yet read back): the last periodic checkpoint is used and the group equals an uninterrupted one.
* A checkpoint of another group (other seeds, another config, tensors of another shape) or a truncated
  one is not used: one log line says why and the group equals a fresh one.
* ``--keep-checkpoints`` keeps the group checkpoints (also those written in worker processes).
* A group does not use its seeds' own checkpoints, nor a lone trial its group's: each says so.
* On CUDA (dropout on) a captured group continues in place and equals the uninterrupted captured group.
"""
from __future__ import annotations

import dataclasses
import io
import os
import signal
import textwrap
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from harness import group as group_mod
from harness import train as train_mod
from harness.checkpoint import checkpoint_path, group_stem
from harness.config import get_preset
from harness.group import run_group
from harness.train import run_trial
from harness.trial import TrialSpec

from .conftest import cli_in_process
from .test_checkpoints import HOLDING_PLUGIN, TIMES, comparable, same, trial_file, weights

#: Columns of a group's rows that are times (besides the trials' own).
GROUP_TIMES = TIMES | {"group_wall_s"}
SEEDS = (0, 1, 2)


def run_args(tmp_path: Path, run_id: str, *extra) -> list[str]:
    return ["--plugin", str(tmp_path / "holding.py"), "run", "--variants", "holds", "--preset", "tiny",
            "--device", "cpu", "--no-check", "--jobs", "1", "--threads", "1", "--save-models", "--seeds", "3",
            "--vectorise-seeds", "on", "--set", "train.steps=40", "--set", "train.eval_every=15",
            "--set", "train.checkpoint_every=6", "--set", "model.dropout=0.1",
            "--results-dir", str(tmp_path), "--run-id", run_id, *extra]


def assert_same_weights(a, b) -> None:
    """Two state_dicts (or their serialised bytes, as a result carries them) equal bit for bit (NaNs included)."""
    a, b = (torch.load(io.BytesIO(x), weights_only=True) if isinstance(x, bytes) else x for x in (a, b))
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].numpy().tobytes() == b[k].numpy().tobytes(), k


def timeless_csv(run: Path) -> pd.DataFrame:
    frame = pd.read_csv(run / "trials.csv")
    return frame.drop(columns=[c for c in frame.columns if c in GROUP_TIMES]).sort_values("seed").reset_index(drop=True)


def test_ctrl_c_mid_group_then_resume_equals_an_uninterrupted_group(tmp_path, monkeypatch, python_ctrl_c):
    (tmp_path / "holding.py").write_text(textwrap.dedent(HOLDING_PLUGIN))
    hold = tmp_path / "hold"
    hold.mkdir()
    monkeypatch.setenv("HOLD_DIR", str(hold))
    monkeypatch.setenv("HOLD_AT", "1000000")  # the uninterrupted run never holds
    whole = cli_in_process(*run_args(tmp_path, "whole"))
    assert whole.returncode == 0, whole.stderr
    assert not (tmp_path / "whole" / "checkpoints").exists()  # removed once the group was stored

    monkeypatch.setenv("HOLD_AT", "25")  # a forward of a group step between the periodic checkpoints (step 14)

    def interrupt():
        deadline = time.monotonic() + 240
        while not (hold / "held").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the group step is held ...
        while signal.getsignal(signal.SIGINT) is not signal.default_int_handler and time.monotonic() < deadline:
            time.sleep(0.02)  # ... until the loop's handler took it ...
        (hold / "release").touch()  # ... then the step ends: the group's checkpoint is written, the run stops

    sender = threading.Thread(target=interrupt, daemon=True)
    sender.start()
    stopped = cli_in_process(*run_args(tmp_path, "stopped"))
    sender.join()
    assert stopped.returncode == 130, stopped.stderr
    assert "Traceback" not in stopped.stderr
    run = tmp_path / "stopped"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["holds__group.pt"]  # one file, the group's
    state = torch.load(run / "checkpoints" / "holds__group.pt", weights_only=True)
    step = state["step"]
    assert 1 < step < 40 and step % 6 != 0  # written at the interrupted step, not a periodic one
    assert state["identity"]["seeds"] == list(SEEDS)
    assert not list((run / "trials").glob("*.json"))

    resumed = cli_in_process("run", "--resume", str(run), "--save-models")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stderr.count(f"continued from its checkpoint at step {step}") == 3
    pd.testing.assert_frame_equal(timeless_csv(run), timeless_csv(tmp_path / "whole"), check_exact=True)
    for seed in SEEDS:
        key = f"holds__s{seed}"
        stored = trial_file(run, key)
        assert stored["row"]["resumed_from_step"] == step and stored["row"]["vectorised"] == 3
        assert same(timeless(stored), timeless(trial_file(tmp_path / "whole", key)))
        assert_same_weights(weights(run, key), weights(tmp_path / "whole", key))
    assert not (run / "checkpoints").exists()


def group_specs(folder: Path, seeds=SEEDS, **train) -> list[TrialSpec]:
    # dropout on (the group's one RNG stream must be restored); a curve row every 5 steps and a read-back every
    # 10 (the warm-up's): the checkpoints at steps 4 and 8 hold losses in no curve row and steps not read back
    cfg = get_preset("tiny").override({"train.steps": 30, "train.eval_every": 10, "train.checkpoint_every": 4,
                                       "train.log_every": 5, "model.dropout": 0.1,
                                       **{f"train.{k}": v for k, v in train.items()}})
    return [TrialSpec("baseline", s, cfg.to_dict(), device="cpu", threads=1, save_model=True,
                      checkpoint_dir=str(folder)) for s in seeds]


def interrupted_at(specs: list[TrialSpec], step: int) -> None:
    """Run the group and raise KeyboardInterrupt when seed 0's step ``step`` is read back (inside the step
    loop, before that step's checkpoint): not a step boundary."""
    def progress(s, loss):
        if s == step:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        run_group(specs, [progress] + [None] * (len(specs) - 1))


def timeless(stored: dict) -> dict:
    """A stored (or returned) trial of a group without its times: :func:`comparable` less ``group_wall_s``."""
    out = comparable(stored)
    return out | {"row": {k: v for k, v in out["row"].items() if k not in GROUP_TIMES}}


def plain(results) -> list[dict]:
    return [timeless(r.to_dict()) for r in results]


def diverging_seed_1(monkeypatch) -> None:
    """Seed 1's model is built with a NaN weight: it diverges at step 1, frozen by the step's mask at once and
    marked diverged when step 1 is read back (at step 10)."""
    real = train_mod.build_model

    def poisoned(registry, variant, cfg, seed=0):
        model = real(registry, variant, cfg, seed=seed)
        if seed == 1:
            with torch.no_grad():
                next(model.parameters()).fill_(float("nan"))
        return model
    monkeypatch.setattr(group_mod, "build_model", poisoned)


@pytest.mark.parametrize("diverging", [False, True])
def test_interrupt_inside_a_step_resumes_the_group_from_its_last_checkpoint(tmp_path, monkeypatch, diverging):
    if diverging:
        diverging_seed_1(monkeypatch)
    specs = group_specs(tmp_path)
    reference = run_group([dataclasses.replace(s, checkpoint_dir="") for s in specs])
    assert [r.row["vectorised"] for r in reference] == [3, 3, 3] and not list(tmp_path.iterdir())
    at, saved = (10, 8) if diverging else (18, 16)  # step 10 is read back (seed 1 found diverged) after step 10's
    interrupted_at(specs, at)
    state = torch.load(checkpoint_path(tmp_path, "baseline__group"), weights_only=True)
    assert state["step"] == saved and state["group"]["pending"]  # steps not read back yet
    assert state["group"]["done"] == [False] * 3
    lines: list[str] = []
    again = run_group(specs, log=lines.append)
    assert lines == []
    assert [r.row["resumed_from_step"] for r in again] == [saved] * 3
    assert [r.row["status"] for r in again] == (["ok", "invalid", "ok"] if diverging else ["ok"] * 3)
    assert same(plain(again), plain(reference))
    for a, b in zip(again, reference):
        assert_same_weights(a.extra["weights"], b.extra["weights"])


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:300])


def _reshape(path: Path) -> None:
    """The same identity, one stacked tensor of another shape (as after a change to the model's code)."""
    state = torch.load(path, weights_only=True)
    state["stacked"]["params"][0] = state["stacked"]["params"][0][:, :-1].clone()
    torch.save(state, path)


@pytest.mark.parametrize("change", ["other seeds", "config", "truncated", "reshaped"])
def test_a_checkpoint_of_another_group_is_not_used(tmp_path, change):
    specs = group_specs(tmp_path)
    interrupted_at(specs, 9)
    ckpt = checkpoint_path(tmp_path, "baseline__group")
    assert torch.load(ckpt, weights_only=True)["step"] == 8
    other, expected = specs, None
    if change == "other seeds":  # seed 2 stored meanwhile: the group is seeds 0 and 1 now
        other, expected = specs[:2], "written for another group (seeds: checkpoint [0, 1, 2], this group [0, 1])"
    elif change == "config":
        other = group_specs(tmp_path, noam_factor=0.5)
        expected = "written for another group (spec.config.train.noam_factor: checkpoint 1.0, this group 0.5)"
    elif change == "truncated":
        _truncate(ckpt)
        expected = "unreadable"
    else:
        _reshape(ckpt)
        expected = "its params tensors have other shapes or dtypes (another model)"
    lines: list[str] = []
    result = run_group(other, log=lines.append)
    fresh = run_group([dataclasses.replace(s, checkpoint_dir="") for s in other])
    assert not any("resumed_from_step" in r.row for r in result)
    assert len(lines) == 1 and "\n" not in lines[0] and "Traceback" not in lines[0]
    assert lines[0].startswith("baseline: checkpoint baseline__group.pt not used: " + expected)
    assert lines[0].endswith("the group trains its seeds from step 0")
    assert same(plain(result), plain(fresh))


def test_group_checkpoints_are_removed_once_stored_and_kept_with_keep_checkpoints(tmp_path):
    base = ["run", "--variants", "baseline", "pre_norm", "--preset", "tiny", "--seeds", "2", "--device", "cpu",
            "--no-check", "--threads", "1", "--vectorise-seeds", "on", "--set", "train.steps=12",
            "--set", "train.checkpoint_every=5",
            "--results-dir", tmp_path]
    removed = cli_in_process(*base, "--jobs", "1", "--run-id", "removed")
    assert removed.returncode == 0, removed.stderr
    assert not (tmp_path / "removed" / "checkpoints").exists()
    assert (tmp_path / "removed" / "trials" / "pre_norm__s1.json").is_file()
    kept = cli_in_process(*base, "--jobs", "2", "--keep-checkpoints", "--run-id", "kept")  # groups in workers
    assert kept.returncode == 0, kept.stderr
    folder = tmp_path / "kept" / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["baseline__group.pt", "pre_norm__group.pt"]
    for variant in ("baseline", "pre_norm"):
        state = torch.load(folder / f"{variant}__group.pt", weights_only=True)
        assert state["step"] == 10 and state["identity"]["seeds"] == [0, 1]
        assert state["identity"]["spec"]["variant"] == variant and "seed" not in state["identity"]["spec"]
        assert pd.read_csv(tmp_path / "kept" / "trials.csv")["vectorised"].tolist() == [2, 2, 2, 2]


def test_a_group_and_a_lone_trial_do_not_use_each_others_checkpoints(tmp_path):
    specs = group_specs(tmp_path, seeds=(0, 1), steps=8)
    checkpoint_path(tmp_path, specs[1].key).write_bytes(b"seed 1 was interrupted running on its own")
    lines: list[str] = []
    results = run_group(specs, log=lines.append)
    assert [r.row["vectorised"] for r in results] == [2, 2] and not any("resumed_from_step" in r.row for r in results)
    assert lines == ["baseline: the checkpoints of seed(s) 1 are not used: a vectorised group continues only from "
                     "its group checkpoint (--vectorise-seeds off continues them); the group trains its seeds from "
                     "step 0"]
    checkpoint_path(tmp_path, group_stem(specs[0])).write_bytes(b"the group was interrupted")
    alone = run_trial(specs[0])
    assert "resumed_from_step" not in alone.row
    assert alone.row["checkpoint_note"].startswith("the group checkpoint baseline__group.pt is not used: a trial "
                                                   "trained on its own continues only from its own checkpoint")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_captured_group_continues_from_its_checkpoint_in_place(tmp_path, monkeypatch):
    """On CUDA the group's step is captured as a graph that replays on the group's tensors: the restored state
    must be copied into them. The resumed captured group gives the uninterrupted one's rows (bitwise: same
    kernels, deterministic CUDA settings) and the step's tensors keep their storage."""
    cfg = get_preset("tiny").override({"train.steps": 30, "train.eval_every": 10, "train.checkpoint_every": 4,
                                       "train.log_every": 5, "model.dropout": 0.1})
    specs = [TrialSpec("baseline", s, cfg.to_dict(), device="cuda", checkpoint_dir=str(tmp_path)) for s in SEEDS]
    reference = run_group([dataclasses.replace(s, checkpoint_dir="") for s in specs])
    interrupted_at(specs, 18)
    pointers = {}
    real = group_mod.GroupCheckpointer.resume

    def resume(self, group):
        before = [b.data_ptr() for b in group.step.flat.buffers]
        step = real(self, group)
        pointers["same"] = before == [b.data_ptr() for b in group.step.flat.buffers]
        return step
    monkeypatch.setattr(group_mod.GroupCheckpointer, "resume", resume)
    again = run_group(specs)
    assert pointers == {"same": True}
    assert [r.row["captured"] for r in again] == [1] * 3 and [r.row["resumed_from_step"] for r in again] == [16] * 3
    for a, b in zip(again, reference):
        assert a.row["status"] == b.row["status"] == "ok"
        assert a.row["heldout_ce"] == b.row["heldout_ce"], (a.row["heldout_ce"], b.row["heldout_ce"])
        assert [r["loss"] for r in a.curve] == [r["loss"] for r in b.curve]
