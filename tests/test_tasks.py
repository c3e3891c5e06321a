"""Pluggable tasks: the Task interface, the harness_add_tasks hook, the built-in tasks' data
layout, the held-out split of each (no evaluation source in the training stream), determinism
per seed, the copy tasks' batches unchanged by the refactoring, and a task plugin end to end."""
from __future__ import annotations

import hashlib
import json

import pandas as pd
import pytest
import torch

from harness import Task
from harness.config import get_preset
from harness.errors import ConfigError, DuplicateNameError, PluginError, UnknownNameError
from harness.tasks import END, PAD, START, heldout_note, heldout_overlap
from harness.tasks import copy as copy_mod
from harness.testing import load_registry

from . import tasks_by_name
from .conftest import ROOT, cli_in_process

TASK_PLUGIN = ROOT / "examples" / "harness-example-task" / "harness_example_task.py"
BUILTIN = ["copy", "copy_fixed", "copy_length", "reverse", "sort"]
#: the answer each padded-layout task must give for a content list
ANSWERS = {"copy": lambda c: c, "copy_length": lambda c: c, "reverse": lambda c: c[::-1], "sort": sorted}


def digest(b) -> str:
    h = hashlib.sha256()
    for t in (b.src, b.tgt, b.tgt_y):
        h.update(str(tuple(t.shape)).encode())
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


#: Digests of the batches of harness.tasks.copy.make_batch / eval_set as they were before tasks
#: became pluggable (main at 8326910): three training batches per seed, and 200 evaluation
#: sequences from the preset's eval_seed.
GOLDEN = {
    ("copy", "tiny", 0): ["d6147f9e8204f2f1", "e2c64831168839e9", "caa93449aa452e33"],
    ("copy", "tiny", 1): ["15a0ac3915872c35", "6c81a1ca7380b9d2", "b76b804a4138aca6"],
    ("copy", "tiny", "eval"): "52ce80ae2999c790",
    ("copy", "quick", 0): ["6291820d42f54a2a", "7acb26b5abcd6f21", "cc208efa20e7af95"],
    ("copy", "quick", 1): ["41c7ce50c63086c0", "9e12e05f614e5a29", "6f0e6ba3852cbb48"],
    ("copy", "quick", "eval"): "9a0f8ad7ce572266",
    ("copy_fixed", "tiny", 0): ["1f46bd1283f6eb03", "4863aff4c5aa273e", "eca8f68458281100"],
    ("copy_fixed", "tiny", 1): ["9e8f2e4756c5e54f", "7c8a4c9357d1099c", "363deaa00f7d66cd"],
    ("copy_fixed", "tiny", "eval"): "b2de1601bc045be0",
    ("copy_fixed", "quick", 0): ["6c90d9f2eaf56fd6", "2c23522ab9693734", "86bcb3d58a5f752e"],
    ("copy_fixed", "quick", 1): ["c01e5d7b975e2d24", "5d305964644fc298", "b3670129c3930a57"],
    ("copy_fixed", "quick", "eval"): "7f4af25abdf0ea96",
}


@pytest.mark.parametrize("task", ["copy", "copy_fixed"])
@pytest.mark.parametrize("preset", ["tiny", "quick"])
def test_copy_tasks_draw_the_same_batches_as_before(registry, task, preset):
    cfg = get_preset(preset)
    tc, v = cfg.train, cfg.model.vocab
    t = registry.task(task)
    for seed in (0, 1):
        g = torch.Generator().manual_seed(seed)
        assert [digest(t.make_batch(tc.batch, tc.seq_len, v, g)) for _ in range(3)] == GOLDEN[(task, preset, seed)]
        g = torch.Generator().manual_seed(seed)  # the module-level function is the same task
        assert digest(tasks_by_name.make_batch(task, tc.batch, tc.seq_len, v, g)) == GOLDEN[(task, preset, seed)][0]
    assert digest(t.eval_set(200, tc.seq_len, v, tc.eval_seed)) == GOLDEN[(task, preset, "eval")]


def test_builtin_tasks_are_registered_with_their_source(registry):
    assert sorted(registry.tasks) == sorted(BUILTIN + ["g2p", "text"])  # tests/test_g2p.py, tests/test_text_task.py
    for t in registry.tasks.values():
        assert isinstance(t, Task) and t.summary and t.source and t.plugin == "variants.tasks"
        assert type(t).__doc__ and len(type(t).__doc__) > 80, t.name


def rows(b, task, seq_len):
    """Check the padded layout row by row; returns the content lengths."""
    n = (b.src != PAD).sum(1)
    for i, k in enumerate(n.tolist()):
        content = b.src[i, :k].tolist()
        assert (b.src[i, k:] == PAD).all() and all(3 <= x for x in content)
        want = ANSWERS[task](content) + [END] + [PAD] * (b.tgt_y.size(1) - k - 1)
        assert b.tgt_y[i].tolist() == want, (task, content)
    assert (b.tgt[:, 0] == START).all() and torch.equal(b.tgt[:, 1:], b.tgt_y[:, :-1])
    return n


@pytest.mark.parametrize("task", ["copy", "reverse", "sort", "copy_length"])
def test_padded_tasks_layout_and_labels(registry, task):
    t, seq_len, vocab = registry.task(task), 6, 11
    b = t.make_batch(64, seq_len, vocab, torch.Generator().manual_seed(3))
    assert b.src.shape == (64, seq_len) and b.tgt.shape == b.tgt_y.shape == (64, seq_len + 1)
    n = rows(b, task, seq_len)
    assert n.min() >= 1 and n.max() <= seq_len
    e = t.eval_set(64, seq_len, vocab, 5)
    ne = rows(e, task, seq_len)
    if task == "copy_length":  # evaluated on longer sequences only
        assert e.src.shape == (64, 2 * seq_len) and e.tgt_y.shape == (64, 2 * seq_len + 1)
        assert ne.min() >= seq_len + 1 and ne.max() <= 2 * seq_len
        assert t.widths(seq_len) == (2 * seq_len, 2 * seq_len + 1)
    else:
        assert e.src.shape == (64, seq_len) and ne.min() >= 2
        assert not copy_mod.is_heldout(task, b.src, vocab).any() and copy_mod.is_heldout(task, e.src, vocab).all()


def test_reverse_and_sort_examples(registry):
    src = torch.tensor([[5, 7, 3, 5, 0]])
    n = torch.tensor([[4]])
    assert registry.task("reverse").answer(src, n, 11).tolist() == [[5, 3, 7, 5, 0]]
    assert registry.task("sort").answer(src, n, 11).tolist() == [[3, 5, 5, 7, 0]]


@pytest.mark.parametrize("preset", ["tiny", "quick"])
@pytest.mark.parametrize("task", BUILTIN)
def test_evaluation_never_overlaps_the_training_stream(registry, task, preset):
    """Overlap 0 over the first steps x batch training sources of seed 0."""
    cfg = get_preset(preset).override({"train.task": task})
    t = registry.task(task)
    overlap, n = heldout_overlap(t, cfg, seed=0)
    assert (overlap, n) == (0, cfg.train.eval_sequences)
    assert f"0/{n}" in heldout_note(t, cfg, seed=0)


@pytest.mark.parametrize("task", BUILTIN)
def test_same_seed_same_batches(registry, task):
    t = registry.task(task)
    a = [t.make_batch(8, 8, 11, torch.Generator().manual_seed(7)) for _ in range(2)]
    assert digest(a[0]) == digest(a[1])
    assert digest(t.make_batch(8, 8, 11, torch.Generator().manual_seed(8))) != digest(a[0])
    assert digest(t.eval_set(20, 8, 11, 1)) == digest(t.eval_set(20, 8, 11, 1))


def test_copy_length_needs_max_len_for_the_evaluation_lengths(registry):
    cfg = get_preset("tiny").override({"train.task": "copy_length"})  # L = 6, max_len 16 >= 14
    registry.task("copy_length").validate(cfg)
    small = cfg.override({"model.max_len": 13})
    with pytest.raises(ConfigError, match=r"copy_length.*lengths 7-12.*max_len >= 14.*got model.max_len=13"):
        registry.task("copy_length").validate(small)
    registry.task("copy").validate(small)


def test_task_names_are_checked_against_the_registry(registry):
    cfg = get_preset("tiny").override({"train.task": "reverse"})  # any name is a valid config
    assert cfg.train.task == "reverse"
    with pytest.raises(UnknownNameError, match="unknown task 'srot'; did you mean 'sort'"):
        registry.task("srot")
    assert tasks_by_name.task_named("sort").name == "sort"


def test_duplicate_and_nameless_tasks_are_errors(tmp_path):
    one = tmp_path / "one.py"
    one.write_text("from harness import hookimpl\nfrom harness.tasks.copy import CopyTask\n\n"
                   "class Again(CopyTask):\n    name = 'reverse'\n\n"
                   "@hookimpl\ndef harness_add_tasks():\n    return [Again()]\n")
    with pytest.raises(DuplicateNameError, match=r"task 'reverse' is offered by two plugins: "
                                                  r"'variants.tasks' and '.*one.py'"):
        load_registry(files=[one])
    nameless = tmp_path / "nameless.py"
    nameless.write_text("from harness import Task, hookimpl\n\nclass NoName(Task):\n    pass\n\n"
                        "@hookimpl\ndef harness_add_tasks():\n    return [NoName()]\n")
    with pytest.raises(PluginError, match="task NoName has no name"):
        load_registry(files=[nameless])


def test_plugin_task_reuses_the_split(tmp_path):
    reg = load_registry(files=[TASK_PLUGIN])
    t = reg.task("shift")
    b = t.make_batch(32, 6, 11, torch.Generator().manual_seed(0))
    n = (b.src != PAD).sum(1)
    for i, k in enumerate(n.tolist()):
        want = [3 if x == 10 else x + 1 for x in b.src[i, :k].tolist()] + [END]
        assert b.tgt_y[i, :k + 1].tolist() == want
    assert heldout_overlap(t, get_preset("tiny"), 0)[0] == 0


def harness(*args):
    return cli_in_process(*args, cwd=ROOT)


def test_task_plugin_runs_end_to_end(tmp_path):
    r = harness("--plugin", str(TASK_PLUGIN), "run", "--task", "shift", "--variants", "baseline",
                "--preset", "tiny", "-q", "--results-dir", str(tmp_path), "--run-id", "t", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    trials = pd.read_csv(tmp_path / "t" / "trials.csv")
    assert list(trials.status) == ["ok"] and trials.exact_match.between(0, 1).all()
    meta = json.loads((tmp_path / "t" / "config.json").read_text())
    assert meta["config"]["train"]["task"] == "shift" and "0/64" in meta["heldout"]
    r = harness("--plugin", str(TASK_PLUGIN), "list")
    assert r.returncode == 0 and "| shift " in r.stdout and "harness_example_task.py" in r.stdout
    r = harness("run", "--task", "shfit", "--variants", "baseline", "--preset", "tiny", "-q",
                "--results-dir", str(tmp_path))
    assert r.returncode == 2 and "unknown task 'shfit'" in r.stderr
    r = harness("run", "--task", "copy_length", "--set", "model.max_len=12", "--variants", "baseline",
                "--preset", "tiny", "-q", "--results-dir", str(tmp_path))
    assert r.returncode == 2 and "needs model.max_len >= 14" in r.stderr
