"""The dev split: every task has train, dev and test splits, pairwise disjoint; the test split is the one
stored results were scored on; everything a trial selects or stops on reads the dev set, so poisoning the
test set moves the test metrics and nothing else (sequential trials and vectorised groups alike); the
dev numbers sit beside the test numbers in trials.csv; runs stored before the dev split still render."""
from __future__ import annotations

import hashlib
import json
import math
import shutil
import types

import pandas as pd
import pytest
import torch

from harness import group as group_mod
from harness import train as T
from harness.config import get_preset
from harness.tasks import PAD, Task, split_overlaps
from harness.tasks.copy import is_heldout
from harness.tasks.g2p import DEV_MOD, lexicon, split_of
from harness.tasks import splits
from harness.tasks.splits import DEV_SEQUENCES, dev_set
from harness.testing import load_registry
from harness.trial import TrialSpec

from .conftest import ROOT, cli_in_process

POISON = ROOT / "tests" / "plugins" / "poisoned_test_split.py"
SHIFT = ROOT / "examples" / "harness-example-task" / "harness_example_task.py"
SYNTHETIC = ["copy", "copy_fixed", "reverse", "sort", "copy_length"]
#: split_overlaps at the tiny preset (64 test sequences): no overlap anywhere.
ZERO = {"test": (0, 64), "dev": (0, DEV_SEQUENCES), "dev_test": (0, DEV_SEQUENCES)}


def digest(b) -> str:
    h = hashlib.sha256()
    for t in (b.src, b.tgt, b.tgt_y):
        h.update(str(tuple(t.shape)).encode())
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


#: Digests of the test sets (``eval_set(train.eval_sequences, ..., train.eval_seed)``, the whole test split
#: for g2p) computed with main at 7d92c8c, before the dev split existed: the test figures keep their meaning.
TEST_SETS = {("copy", "quick"): "776784ba69f968bf", ("copy", "tiny"): "6e77503024d024d6",
             ("reverse", "tiny"): "c675f75bd72da129", ("sort", "tiny"): "98130f9f8f26e99f",
             ("copy_length", "tiny"): "cabd4bf3e321b7b3", ("copy_fixed", "paper"): "98114f260649d3a7",
             ("g2p", "g2p"): "bbd0dc8ba7b7c8f5"}


def config(registry, task: str, preset: str):
    cfg = get_preset(preset) if task == preset else get_preset(preset).override({"train.task": task})
    return registry.task(task).fit(cfg, set())


@pytest.mark.parametrize("task,preset", sorted(TEST_SETS))
def test_the_test_split_is_the_one_stored_results_were_scored_on(registry, task, preset):
    assert digest(splits.test_set(registry.task(task), config(registry, task, preset))) == TEST_SETS[(task, preset)]


@pytest.mark.parametrize("task", SYNTHETIC + ["shift"])
def test_a_synthetic_dev_set_is_disjoint_from_training_and_test_and_fixed_by_its_seed(task):
    reg = load_registry(files=[SHIFT])
    t, cfg = reg.task(task), get_preset("tiny").override({"train.task": task})
    test = splits.test_set(t, cfg)
    dev = dev_set(t, cfg, test.src)
    assert dev.src.size(0) == DEV_SEQUENCES
    assert split_overlaps(t, cfg, seed=0) == ZERO
    tests = {tuple(r) for r in test.src.tolist()}
    assert not any(tuple(r) in tests for r in dev.src.tolist())  # an independent check of dev_test
    if task not in ("copy_length", "copy_fixed"):
        assert is_heldout("copy", dev.src, cfg.model.vocab).all()  # on the held-out side of the hash split
    assert digest(dev_set(t, cfg, test.src)) == digest(dev)  # the same for every trial
    assert digest(dev_set(t, cfg, test.src, seed=cfg.train.eval_seed + 2)) != digest(dev)  # its own stream


def test_the_dev_set_leaves_out_the_short_sequences_the_test_set_holds(registry):
    """At the quick preset the copy test set (1000 draws) holds every held-out sequence of content
    length 2, so the dev set has none of that length: what docs/tasks.md says about its lengths."""
    t, cfg = registry.task("copy"), get_preset("quick")
    test = splits.test_set(t, cfg)
    lengths = (dev_set(t, cfg, test.src).src != PAD).sum(1)
    assert int(lengths.min()) >= 3 and int((test.src != PAD).sum(1).min()) == 2


def test_g2p_dev_words_are_a_recorded_slice_of_the_training_words(registry):
    lex = lexicon()
    train = {w for w, _ in lex.train_pairs}
    dev, test = {w for w, _ in lex.dev_words}, {w for w, _ in lex.test_words}
    assert not dev & train and not dev & test and not train & test
    assert len(train) == lex.n_train_words
    # the counts docs/tasks.md gives: 105,605 non-test words before the dev split, 11,886 test words as before
    assert (lex.n_train_words, len(dev), len(test), len(lex.train_pairs)) == (100298, 5307, 11886, 107211)
    letters = "abcdefghijklmnopqrstuvwxyz"
    assert all(split_of("".join(letters[i - 3] for i in w)) == "dev" for w in list(dev)[:500])
    share = len(dev) / (len(dev) + len(train))  # 1 in DEV_MOD of the words that are not test words
    assert abs(share - 1 / DEV_MOD) < 0.005
    t = registry.task("g2p")
    cfg = t.fit(get_preset("tiny").override({"train.task": "g2p", "train.steps": 50}), set())
    assert split_overlaps(t, cfg, seed=0) == ZERO
    rows = t.dev_set(DEV_SEQUENCES, cfg.train.seq_len, cfg.model.vocab, 1235, torch.zeros(0, 1, dtype=torch.long))
    got = {tuple(r[r != PAD].tolist()) for r in rows.src}
    assert len(got) == DEV_SEQUENCES and got <= dev  # dev words, no repeats
    # the training stream (bucketed or not) never draws one
    for bucket in (False, True):
        stream = t.batches(cfg.override({"train.bucket": bucket}), torch.Generator().manual_seed(0))
        drawn = {tuple(r[r != PAD].tolist()) for _ in range(20) for r in next(stream).src}
        assert drawn and not drawn & dev


#: A config at which the tiny model moves within seconds (a poisoned test set then scores far apart).
MOVING = {"train.steps": 40, "train.eval_every": 10, "train.noam_factor": 2.0, "train.seq_len": 3,
          "model.d_model": 32, "model.d_ff": 64, "train.warmup": 20, "train.batch": 32}
#: What differs between two trials of the same seed whatever they read: wall times.
TIMES = {"train_s", "wall_s", "step_ms", "tokens_per_s", "overhead_share", "time_to_solve_s", "group_wall_s",
         "peak_mem_mb"}
#: The test set's numbers (the trial row's metric columns).
TEST_COLUMNS = {"heldout_ce", "heldout_token_acc", "exact_match"}


def _pair(run) -> dict[str, list]:
    """``copy`` and ``copy_poisoned`` trained by ``run(specs)`` from the same seeds."""
    plugins = {"modules": [], "files": [str(POISON)], "strict": False}
    cfg = get_preset("tiny").override(MOVING)
    out = {}
    for task in ("copy", "copy_poisoned"):
        c = cfg.override({"train.task": task}).to_dict()
        out[task] = run([TrialSpec("baseline", s, c, device="cpu", threads=1, plugins=plugins) for s in (0, 1)])
    return out


def _assert_only_the_test_metrics_move(results: dict[str, list]) -> None:
    for clean, poisoned in zip(results["copy"], results["copy_poisoned"]):
        a, b = clean.row, poisoned.row
        assert a["status"] == b["status"] == "ok", (a.get("reason"), b.get("reason"))
        drop = TIMES | TEST_COLUMNS | {"slot_task"}
        same = {k: v for k, v in a.items() if k not in drop}
        assert same.keys() == {k for k in b if k not in drop}
        for k, v in same.items():  # dev_*, steps_to_solve, heldout_auc, status, reason, params, losses ...
            assert v == b[k] or (isinstance(v, float) and math.isnan(v) and math.isnan(b[k])), k
        assert {"dev_ce", "dev_exact_match", "dev_token_acc"} <= same.keys()
        untimed = [[{k: v for k, v in r.items() if k != "wall_s"} for r in t.curve] for t in (clean, poisoned)]
        assert untimed[0] == untimed[1] and [r["split"] for r in clean.curve if r["split"] != "train"] == ["dev"] * 4
        assert b["heldout_ce"] > a["heldout_ce"] + 0.5  # the test metric did move


def test_a_poisoned_test_set_moves_the_test_metrics_and_nothing_else():
    """``copy_poisoned`` (tests/plugins/poisoned_test_split.py) asks for garbage on its test set only: its
    trials' curves, dev numbers, steps to solve, mean dev CE and status equal ``copy``'s, bit for bit."""
    _assert_only_the_test_metrics_move(_pair(lambda specs: [T.run_trial(s) for s in specs]))


def test_a_vectorised_group_reads_the_test_set_only_at_the_end_too():
    results = _pair(group_mod.run_group)
    assert all(r.row["vectorised"] == 2 for rs in results.values() for r in rs)
    _assert_only_the_test_metrics_move(results)


def _fake_scores(monkeypatch, dev_solves_at: int | None):
    """Task.evaluate replaced: exact match 1.0 on the test set (every call whose rows are the test set's),
    on the dev set 1.0 from the ``dev_solves_at``-th evaluation on (None: never)."""
    calls = types.SimpleNamespace(dev=0)

    def evaluate(self, model, data, cfg, *args, **kwargs):
        if data.src.size(0) == cfg.train.eval_sequences:  # the test set (64 rows; dev has 200)
            return {"heldout_ce": 0.01, "heldout_token_acc": 1.0, "exact_match": 1.0}
        calls.dev += 1
        solved = dev_solves_at is not None and calls.dev >= dev_solves_at
        return {"heldout_ce": 0.5, "heldout_token_acc": 0.5, "exact_match": 1.0 if solved else 0.0}
    monkeypatch.setattr(Task, "evaluate", evaluate)


@pytest.mark.parametrize("stop", [False, True])
def test_solved_and_stopping_read_the_dev_set_only(registry, monkeypatch, stop):
    """A test set scored perfect never makes a trial "solved" nor stops it; the dev set does, at its own
    evaluation (the real training loop, with the scores faked)."""
    cfg = get_preset("tiny").override({"train.steps": 12, "train.eval_every": 3, "train.stop_at_solved": stop})
    model = lambda: T.build_model(registry, registry.variants["baseline"], cfg.model, seed=0)  # noqa: E731
    _fake_scores(monkeypatch, None)
    metrics, _ = T.train(model(), cfg, seed=0, device=torch.device("cpu"))
    assert metrics["exact_match"] == 1.0 and metrics["dev_exact_match"] == 0.0
    assert math.isnan(metrics["steps_to_solve"]) and metrics["steps"] == 12
    _fake_scores(monkeypatch, 2)
    metrics, curve = T.train(model(), cfg, seed=0, device=torch.device("cpu"))
    assert metrics["steps_to_solve"] == 6 and metrics["steps"] == (6 if stop else 12)
    assert metrics["dev_exact_match"] == 1.0 and metrics["dev_ce"] == 0.5 and metrics["heldout_ce"] == 0.01
    assert [r["step"] for r in curve if r["split"] == "dev"] == ([3, 6, 6] if stop else [3, 6, 9, 12])


def test_the_loop_never_solves_on_the_test_set():
    loop = types.SimpleNamespace(status="ok", reason="", step=8, train_s=1.0, curve=[], solved_step=None,
                                 solved_s=None, tokens=1, warm_s=0.0, warm_tokens=0, first_losses=[1.0],
                                 last_losses=[1.0], tracking=types.SimpleNamespace(point=lambda row: None),
                                 task=Task(), cfg=get_preset("tiny"))
    good, bad = {"heldout_ce": 0.1, "heldout_token_acc": 1.0, "exact_match": 1.0}, \
        {"heldout_ce": 2.0, "heldout_token_acc": 0.1, "exact_match": 0.0}
    row = T.TrainingLoop.metrics(loop, good, [], bad)
    assert math.isnan(row["steps_to_solve"]) and row["exact_match"] == 1.0 and row["dev_exact_match"] == 0.0
    assert loop.curve[-1]["loss"] == 2.0 and loop.curve[-1]["split"] == "dev"
    loop.curve, loop.solved_step = [], None
    row = T.TrainingLoop.metrics(loop, bad, [], good)
    assert row["steps_to_solve"] == 8 and row["exact_match"] == 0.0 and row["dev_ce"] == 0.1


def test_a_plugin_task_written_before_dev_sets_gets_one(tmp_path):
    """A task with only ``make_batch`` and ``eval_set`` (today's interface) gets a dev set from its
    ``eval_set`` at other seeds; one whose ``eval_set`` is a fixed list that the test set exhausts gets one line
    and exit 2, before any trial."""
    src = (
        "import torch\nfrom harness import Task, hookimpl\nfrom harness.tasks import Batch\n\n"
        "class Parity(Task):\n"
        "    name, summary, source = 'parity', 'the parity of 8 bits', 'a test'\n"
        "    def _rows(self, n, gen, held):\n"
        "        bits = torch.randint(0, 2, (n, 8), generator=gen)\n"
        "        bits[:, 0] = held  # held out: rows whose first bit is 1 (128 of them)\n"
        "        y = torch.stack([3 + bits[:, 1:].sum(1) % 2, torch.full((n,), 2)], 1)\n"
        "        return Batch(bits + 3, torch.cat([torch.ones(n, 1, dtype=torch.long), y[:, :1]], 1), y)\n"
        "    def widths(self, seq_len):\n"
        "        return 8, 2\n"
        "    def make_batch(self, batch, seq_len, vocab, generator):\n"
        "        return self._rows(batch, generator, 0)\n"
        "    def eval_set(self, n, seq_len, vocab, seed):\n"
        "        return EVAL(self, n, seed)\n\n"
        "@hookimpl\ndef harness_add_tasks():\n    return [Parity()]\n")
    good, fixed = tmp_path / "parity.py", tmp_path / "parity_fixed.py"
    good.write_text("EVAL = lambda task, n, seed: task._rows(n, torch.Generator().manual_seed(seed), 1)\n" + src)
    every = "[[1] + [(i >> b) & 1 for b in range(7)] for i in range(128)]"  # every held-out row, whatever n and seed
    fixed.write_text(f"EVAL = lambda task, n, seed: task.rows_of(torch.tensor({every}))\n" + src
                     + "Parity.rows_of = lambda self, bits: Batch(bits + 3, torch.cat([torch.ones(128, 1, "
                       "dtype=torch.long), 3 + bits[:, 1:].sum(1, keepdim=True) % 2], 1), "
                       "torch.stack([3 + bits[:, 1:].sum(1) % 2, torch.full((128,), 2)], 1))\n")
    args = ("run", "--task", "parity", "--variants", "baseline", "--preset", "tiny", "-q", "--device", "cpu",
            "--set", "train.steps=4", "--set", "train.eval_every=2", "--results-dir", tmp_path)
    r = cli_in_process("--plugin", good, *args, "--run-id", "good")
    assert r.returncode == 0, r.stderr
    trials = pd.read_csv(tmp_path / "good" / "trials.csv")
    assert list(trials.status) == ["ok"] and trials.dev_exact_match.between(0, 1).all()
    note = json.loads((tmp_path / "good" / "config.json").read_text())["heldout"]
    assert f"dev set: {DEV_SEQUENCES} sequences drawn like the test set" in note  # 128 held-out rows, 64 drawn for test
    assert f"with the test set: 0/{DEV_SEQUENCES}" in note
    r = cli_in_process("--plugin", fixed, *args, "--run-id", "fixed")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "the parity task has no dev sequences" in r.stderr and "give it a dev_set" in r.stderr
    assert not (tmp_path / "fixed" / "trials").is_dir() or not any((tmp_path / "fixed" / "trials").iterdir())


def test_a_run_stored_before_the_dev_split_still_reports_and_verifies(tmp_path):
    ref = ROOT / "results" / "reference" / "task-reverse"
    assert "dev_ce" not in pd.read_csv(ref / "trials.csv").columns  # made before the dev split
    run = tmp_path / "task-reverse"
    shutil.copytree(ref, run)
    r = cli_in_process("verify", run)
    assert r.returncode == 0, r.stdout + r.stderr
    r = cli_in_process("report", run)
    assert r.returncode == 0, r.stderr
    report = (run / "report.md").read_text()
    assert "this run was stored before the dev split" in report and "Training and held-out curves" in report
    assert "dev_ce" not in pd.read_csv(run / "trials.csv").columns
