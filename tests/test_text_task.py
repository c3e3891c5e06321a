"""The ``text`` task (Tiny Shakespeare, character level): the committed corpus, nanoGPT's split with a dev slice
that training never draws from, the batch convention, ``task.path`` end to end, ``bpc`` and the vocabulary checks.

Where a window's position must be known, the corpus is a file of distinct characters (character i is
``chr(FIRST + i)``), so every id names its position: a window drawn from the wrong region cannot hide."""
from __future__ import annotations

import gzip
import hashlib
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

import harness
from harness.config import get_preset
from harness.errors import ConfigError
from harness.planning import resolve_config
from harness.tasks import splits
from harness.tasks.base import END, PAD, START, count_overlap
from harness.tasks.text import (CORPUS_SHA256, LOW, TextTask, corpus, min_chars, spaced_starts, split_regions)
from harness.vstep import bucket_widths, stack_batches

from .conftest import ROOT, cli_in_process

DATA = ROOT / "harness" / "tasks" / "data" / "tinyshakespeare" / "input.txt.gz"
CHARS = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
FIRST = 0x4E00  #: the first of the distinct characters of :func:`positional_file` (CJK ideographs)


def positional_file(tmp_path: Path, n: int = 3000) -> Path:
    """A UTF-8 file of ``n`` distinct characters in code-point order: id - 3 is the position."""
    path = tmp_path / "positions.txt"
    path.write_text("".join(chr(FIRST + i) for i in range(n)), encoding="utf-8")
    return path


def bound(path: Path | str) -> TextTask:
    return TextTask().for_config(get_preset("tiny").override({"train.task": "text", "task.path": str(path)}))


def test_the_committed_corpus_is_tiny_shakespeare():
    text = gzip.decompress(DATA.read_bytes())
    assert hashlib.sha256(text).hexdigest() == CORPUS_SHA256 == \
        "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
    text = text.decode("utf-8")
    assert len(text) == 1_115_394 and "".join(sorted(set(text))) == CHARS and len(CHARS) == 65
    c = corpus()
    assert c.chars == CHARS and c.vocab == 68 and c.ids.numel() == len(text)
    assert "".join(CHARS[i - LOW] for i in c.ids[:40].tolist()) == text[:40] == "First Citizen:\nBefore we proceed any fur"
    assert int(c.ids.min()) == LOW and int(c.ids.max()) == 67


def test_the_split_is_nanogpts_with_a_dev_slice_out_of_training():
    n = 1_115_394
    r = split_regions(n)
    assert r["test"] == (int(n * 0.9), n) == (1_003_854, 1_115_394)  # nanoGPT's train / val cut
    assert r["test"][1] - r["test"][0] == 111_540
    assert r["dev"] == (953_662, 1_003_854) and r["dev"][1] - r["dev"][0] == 1_003_854 // 20 == 50_192
    assert r["train"] == (0, 953_662)
    for m in (min_chars(6), 5000, 12345):  # the three regions tile the text, none empty
        q = split_regions(m)
        assert q["train"][0] == 0 and q["train"][1] == q["dev"][0] and q["dev"][1] == q["test"][0] and q["test"][1] == m
    assert min(hi - lo for lo, hi in split_regions(min_chars(64)).values()) >= 65
    assert min(hi - lo for lo, hi in split_regions(min_chars(64) - 1).values()) < 65  # the shortest, exactly


@pytest.mark.parametrize("seq_len", [1, 5, 64])
def test_training_never_draws_a_dev_or_test_window_and_reaches_both_ends(tmp_path, seq_len):
    task = bound(positional_file(tmp_path))
    (_, train_hi), (dev_lo, dev_hi), (test_lo, test_hi) = split_regions(3000).values()
    starts = []
    for seed in range(12):
        gen = torch.Generator().manual_seed(seed)
        for _ in range(25):
            b = task.make_batch(64, seq_len, 3003, gen)
            pos = torch.cat([b.src, b.tgt_y], dim=1) - LOW  # (B, C + 1) positions of w_0 .. w_C
            assert torch.equal(pos - pos[:, :1], torch.arange(seq_len + 1).expand_as(pos))  # contiguous windows
            starts += pos[:, 0].tolist()
    assert min(starts) == 0 and max(starts) == train_hi - seq_len - 1  # the last window ends at the dev slice
    for region, (lo, hi), make in (("test", (test_lo, test_hi), task.eval_set), ("dev", (dev_lo, dev_hi), task.dev_set)):
        args = (10**6, seq_len, 3003, 7) + ((torch.zeros(0, 1, dtype=torch.long),) if region == "dev" else ())
        b = make(*args)
        pos = torch.cat([b.src, b.tgt_y], dim=1) - LOW
        assert int(pos.min()) >= lo and int(pos.max()) < hi, region
        labels = b.tgt_y.flatten() - LOW
        assert labels.unique().numel() == labels.numel()  # no character scored twice
        assert b.src.size(0) == (hi - lo - 1) // seq_len  # capped: the windows tile the region


def test_the_rows_follow_the_batch_convention():
    task = TextTask()
    b = task.make_batch(8, 16, 68, torch.Generator().manual_seed(3))
    assert b.src.shape == (8, 1) and b.tgt.shape == b.tgt_y.shape == (8, 16) and task.widths(16) == (1, 16)
    assert (b.tgt[:, 0] == START).all() and torch.equal(b.tgt[:, 1:], b.tgt_y[:, :-1])
    assert not ((b.tgt_y == PAD) | (b.tgt_y == END) | (b.tgt_y == START)).any() and b.ntokens == 8 * 16
    text = "".join(CHARS[i - LOW] for i in corpus().ids[:953_662].tolist())
    for row in range(8):  # w_0 .. w_C occur together in the training region
        window = "".join(CHARS[i - LOW] for i in [b.src[row, 0].item(), *b.tgt_y[row].tolist()])
        assert window in text
    again = task.make_batch(8, 16, 68, torch.Generator().manual_seed(3))
    assert all(torch.equal(x, y) for x, y in zip((b.src, b.tgt, b.tgt_y), (again.src, again.tgt, again.tgt_y)))


def test_the_index_fast_path_stacks_the_same_tensors_as_the_batches():
    task, cfg = TextTask(), get_preset("text_cpu").override({"train.batch": 5})
    full = task.widths(cfg.train.seq_len)
    streams = [task.batches(cfg, torch.Generator().manual_seed(s)) for s in (0, 4)]
    draws = [task.index_stream(cfg, torch.Generator().manual_seed(s)) for s in (0, 4)]
    for step in range(6):
        batches, idx = [next(s) for s in streams], [next(d) for d in draws]
        fit = (lambda s, t: bucket_widths(s, t, full)) if step % 2 else (lambda s, t: None)
        want = stack_batches(batches, fit(1, cfg.train.seq_len), pad=PAD)
        got, ntokens = task.stack_indices(cfg, idx, fit)
        assert all(torch.equal(a, w) for a, w in zip(got, want)) and ntokens == [b.ntokens for b in batches]


def test_evaluation_windows_are_spaced_evenly_and_their_phase_follows_the_seed():
    for length, n, c, seed in ((111_540, 500, 64, 1234), (50_192, 200, 64, 1235), (300, 10**6, 6, 0), (66, 3, 64, 9)):
        s = spaced_starts(length, n, c, seed)
        assert s.numel() == min(n, (length - 1) // c) and int(s.min()) >= 0 and int(s.max()) + c <= length - 1
        if s.numel() > 1:
            assert int(s.diff().min()) >= c and s.diff().unique().numel() == 1  # even, no label twice
    assert not torch.equal(spaced_starts(111_540, 500, 64, 0), spaced_starts(111_540, 500, 64, 1))
    task = TextTask()
    test = task.eval_set(500, 64, 68, 1234)
    assert test.src.size(0) == 500 and torch.equal(test.tgt_y, task.eval_set(500, 64, 68, 1234).tgt_y)


def test_the_measured_overlaps_compare_whole_windows_not_their_one_character_source():
    reg = harness.registry.Registry.from_plugins()
    cfg = resolve_config("tiny", ["train.task=text", "train.steps=30"], reg)
    task = reg.task("text")
    test = splits.test_set(task, cfg)
    stream = task.batches(cfg, torch.Generator().manual_seed(0))  # what split_overlaps draws: 30 steps of seed 0
    train = [torch.cat([b.src, b.tgt_y], 1) for b in (next(stream) for _ in range(cfg.train.steps))]
    windows = torch.cat([test.src, test.tgt_y], 1)
    assert splits.split_overlaps(task, cfg, seed=0)["test"] == (count_overlap(windows, train), 64)
    assert count_overlap(test.src, [t[:, :1] for t in train]) > 50  # sources alone: nearly every one "overlaps"


def test_task_path_runs_end_to_end_and_bpc_is_ce_in_bits(tmp_path):
    text = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" * 40
    path = tmp_path / "hamlet.txt"
    path.write_text(text, encoding="utf-8")
    out = tmp_path / "runs"
    r = cli_in_process("run", "--variants", "baseline", "--task", "text", "--preset", "tiny", "--set",
                       f"task.path={path}", "--no-check", "--save-models", "-q", "--results-dir", out)
    assert r.returncode == 0, r.stderr
    run_dir = next(out.iterdir())
    trials = pd.read_csv(run_dir / "trials.csv")
    assert list(trials.status) == ["ok"] and len(trials) == 1
    assert math.isclose(trials.bpc[0], trials.heldout_ce[0] / math.log(2), rel_tol=1e-12)
    assert math.isclose(trials.dev_bpc[0], trials.dev_ce[0] / math.log(2), rel_tol=1e-12)
    meta = harness.load_run(run_dir).meta
    assert meta.config["model"]["vocab"] == 3 + len(set(text)) and meta.config["task"]["path"] == str(path)
    report = (run_dir / "report.md").read_text()
    assert f"task.path={str(path)!r}" in report and "bpc IQM [95% CI]" in report
    assert "exact-match IQM" not in report and "EM≥0.99" not in report  # no exact match of a whole window
    (sample,) = harness.decode(run_dir, ["To be"], "baseline", 0)  # what `python -m harness decode` prints
    assert set(sample) <= set(text) and 0 < len(sample) <= 16 - 1  # up to model.max_len - 1 characters, all the file's


def test_a_missing_file_and_a_short_one_are_refused_in_one_line(tmp_path):
    missing = tmp_path / "nowhere.txt"
    short = tmp_path / "short.txt"
    short.write_text("too short\n" * 10, encoding="utf-8")  # 100 characters
    for path, want in ((missing, "cannot read it"), (short, f"needs at least {min_chars(6):,}")):
        r = cli_in_process("run", "--variants", "baseline", "--task", "text", "--preset", "tiny", "--set",
                           f"task.path={path}", "-q", "--results-dir", tmp_path / "runs")
        assert r.returncode == 2 and want in r.stderr and str(path) in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("caf\xe9 ".encode("latin-1") * 2000)
    with pytest.raises(ConfigError, match="is not UTF-8 text"):
        bound(latin).corpus()


def test_the_vocabulary_is_set_unless_given_and_a_smaller_one_is_refused(tmp_path):
    reg = harness.registry.Registry.from_plugins()
    assert resolve_config("tiny", ["train.task=text"], reg).model.vocab == 68
    assert resolve_config("text_cpu", [], reg) == get_preset("text_cpu")  # the preset needs no fitting
    small = resolve_config("tiny", ["train.task=text", "model.vocab=20"], reg)
    assert small.model.vocab == 20
    with pytest.raises(ConfigError, match="needs model.vocab >= 68, got 20"):
        reg.task("text").validate(small)
    r = cli_in_process("run", "--task", "text", "--preset", "tiny", "--set", "model.vocab=67", "--variants",
                       "baseline", "-q", "--results-dir", tmp_path)
    assert r.returncode == 2 and "needs model.vocab >= 68, got 67" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    path = positional_file(tmp_path, 2000)
    assert resolve_config("tiny", ["train.task=text", f"task.path={path}"], reg).model.vocab == 2003


def test_only_a_task_that_reads_a_file_takes_task_path(tmp_path):
    reg = harness.registry.Registry.from_plugins()
    cfg = resolve_config("tiny", [f"task.path={tmp_path / 'x.txt'}"], reg)
    with pytest.raises(ConfigError, match="the copy task reads no file"):
        reg.task("copy").validate(cfg)
    r = cli_in_process("run", "--task", "g2p", "--preset", "tiny", "--set", "task.path=x.txt", "--variants",
                       "baseline", "-q", "--results-dir", tmp_path)
    assert r.returncode == 2 and "the g2p task reads no file" in r.stderr
    with pytest.raises(ConfigError, match="path must be str"):
        get_preset("tiny").override({"task.path": 3})


def test_decoding_reads_and_writes_characters():
    task, cfg = TextTask(), get_preset("text_cpu")
    ids = task.encode_input("ROMEO:\nO", cfg)
    assert task.decode_output(ids, cfg) == "ROMEO:\nO" and all(LOW <= i < 68 for i in ids)
    assert task.decode_output((3, 67, 1, 99), cfg) == "\nz<1><99>"
    with pytest.raises(ConfigError, match=r"not among them: '#é'"):
        task.encode_input("café #", cfg)
    with pytest.raises(ConfigError, match="at most model.max_len = 66"):
        task.encode_input("a" * 67, cfg)


def test_task_path_at_its_default_leaves_stored_config_hashes_alone(tmp_path):
    from harness.settings import hash_view

    assert "task" not in hash_view(get_preset("quick").to_dict())  # runs stored before task.path keep their hash
    with_path = get_preset("tiny").override({"train.task": "text", "task.path": str(tmp_path / "a.txt")})
    assert hash_view(with_path.to_dict())["task"] == {"path": str(tmp_path / "a.txt")}


def test_a_text_group_trains_the_same_with_and_without_the_index_fast_path(monkeypatch):
    """Two seeds as one vectorised group: the fast path (window starts, one gather) is used, changes nothing,
    and the batched evaluation adds ``bpc`` as each seed's own would."""
    from harness import group as group_mod
    from harness.trial import TrialSpec

    cfg = resolve_config("tiny", ["train.task=text", "train.steps=6", "train.eval_every=3", "train.eval_sequences=24"],
                         harness.registry.Registry.from_plugins())
    specs = [TrialSpec("baseline", s, cfg.to_dict(), device="cpu", threads=1) for s in (0, 1)]
    calls, real = [], TextTask.stack_indices
    monkeypatch.setattr(TextTask, "stack_indices", lambda self, *a: calls.append(1) or real(self, *a))
    fast = group_mod.run_group(specs)
    assert len(calls) == 7  # the probe on the first batches, then one per step
    monkeypatch.setattr(TextTask, "index_stream", lambda self, cfg, gen: None)
    slow = group_mod.run_group(specs)
    for f, s in zip(fast, slow):
        assert f.row["vectorised"] == 2 and f.row["status"] == "ok"
        assert [r["loss"] for r in f.curve] == [r["loss"] for r in s.curve]
        assert f.row["heldout_ce"] == s.row["heldout_ce"]
        assert math.isclose(f.row["bpc"], f.row["heldout_ce"] / math.log(2), rel_tol=1e-12)
