"""The g2p task (CMUdict): the word-level split, the vocabulary the task sets, WER / PER with
several references, greedy and beam-search decoding, bucketed batches, and one tiny run end to
end whose report shows WER and PER. Kept cheap: the lexicon loads once per worker (~1-5 s)."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

import harness
from harness.config import RunConfig, config_keys, get_preset
from harness.settings import hash_view
from harness.errors import ConfigError
from harness.planning import resolve_config
from harness.model import build_model
from harness.tasks import heldout_overlap
from harness.tasks.base import END, PAD, START
from harness.tasks.copy import greedy_decode
from harness.tasks.decoding import _strip, beam_search, error_counts, greedy, wer_per
from harness.tasks.g2p import MAX_LETTERS, VOCAB, G2PTask, is_test, lexicon

from .conftest import ROOT, cli_in_process

pytestmark = pytest.mark.xdist_group("g2p")  # one worker loads the lexicon


@pytest.fixture(scope="module")
def lex():
    return lexicon()


def test_split_is_a_stable_hash_of_the_word_and_disjoint(lex):
    # SHA-256 based, not hash(): these hold in every process, whatever PYTHONHASHSEED says
    assert [w for w in ("a", "cat", "the", "dog", "who", "read", "make") if is_test(w)] == ["a", "the", "who", "make"]
    code = "from harness.tasks.g2p import is_test; print([is_test(w) for w in ('the', 'cat', 'who')])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONHASHSEED": "123", "PYTHONPATH": str(ROOT)}).stdout
    assert out.strip() == "[True, False, True]"
    train = {w for w, _ in lex.train_pairs}
    test = {w for w, _ in lex.test_words}
    assert not train & test and len(train) == lex.n_train_words
    assert 0.08 < len(test) / (len(test) + len(train)) < 0.12
    assert all(3 <= i < 29 for w in list(test)[:500] for i in w) and max(map(len, test | train)) <= MAX_LETTERS


def test_stress_stripped_and_several_pronunciations_kept(lex):
    phones = {lex.phones[i - 29] for _, refs in lex.test_words for r in refs for i in r}
    assert len(lex.phones) == 39 and not any(ch.isdigit() for p in phones for ch in p)
    the = [refs for w, refs in lex.test_words if w == tuple(3 + "abcdefghijklmnopqrstuvwxyz".index(c) for c in "the")]
    spoken = {" ".join(lex.phones[i - 29] for i in r) for r in the[0]}
    assert spoken == {"DH AH", "DH IY"}  # DH AH0 / DH AH1 merge once stress is stripped


def test_heldout_overlap_is_zero_with_bucketed_batches():
    cfg = resolve_config("tiny", ["train.task=g2p", "train.bucket=True", "train.steps=40"],
                         harness.registry.Registry.from_plugins())
    task = harness.registry.Registry.from_plugins().task("g2p")
    assert heldout_overlap(task, cfg, seed=0) == (0, cfg.train.eval_sequences)
    stream = task.batches(cfg, torch.Generator().manual_seed(0))
    for _ in range(5):
        b = next(stream)
        assert (b.src[:, -1] != PAD).any() and (b.tgt_y[:, -1] != PAD).any()  # trimmed to the longest row
        assert (b.tgt[:, 0] == START).all() and torch.equal(b.tgt[:, 1:], b.tgt_y[:, :-1])


def test_the_task_sets_vocab_and_max_len_unless_given(tmp_path):
    reg = harness.registry.Registry.from_plugins()
    cfg = resolve_config("tiny", ["train.task=g2p"], reg)
    assert (cfg.model.vocab, cfg.model.max_len) == (VOCAB, 22)
    with pytest.raises(ConfigError, match="needs model.vocab >= 68, got 20"):
        reg.task("g2p").validate(resolve_config("tiny", ["train.task=g2p", "model.vocab=20"], reg))
    for bad, need in (("model.vocab=20", "model.vocab >= 68"), ("model.max_len=16", "model.max_len >= 22")):
        r = cli_in_process("run", "--task", "g2p", "--preset", "tiny", "--set", bad, "--variants", "baseline", "-q",
                           "--results-dir", str(tmp_path))
        assert r.returncode == 2 and need in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_new_config_keys_leave_stored_hashes_alone():
    cfg = get_preset("quick").to_dict()
    assert "beam" not in hash_view(cfg)["train"] and "bucket" not in hash_view(cfg)["train"]
    assert hash_view(get_preset("g2p").to_dict())["train"]["bucket"] is True
    assert {"train.beam", "train.bucket"} <= set(config_keys())
    with pytest.raises(ConfigError, match="beam must be >= 1"):
        RunConfig().override({"train.beam": 0})


def test_wer_counts_a_match_with_any_reference_and_per_the_closest():
    refs = [[(5, 6, 7), (5, 8, 7)], [(5, 6)], [(9, 9, 9, 9)]]
    hyps = [(5, 8, 7), (5, 6, 7), (9, 9)]  # right (second reference), one insertion, two deletions
    assert error_counts(hyps, refs) == (2, 3, 3 + 2 + 4)
    assert wer_per(hyps, refs) == pytest.approx((2 / 3, 3 / 9))


def test_per_uses_the_library_and_matches_a_hand_count():
    # kitten -> sitting: substitute k->s, e->i, insert g: 3 edits (the textbook Levenshtein example)
    ids = {c: i + 3 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz")}
    kitten, sitting = (tuple(ids[c] for c in w) for w in ("kitten", "sitting"))
    assert error_counts([kitten], [[sitting]]) == (1, 3, 7)
    assert error_counts([(1, 2, 3)], [[(1, 3, 4, 5)]]) == (1, 3, 4)  # delete 2, insert 4 and 5 (or 2 subs + 1 ins)


@pytest.fixture(scope="module")
def tiny_model():
    reg = harness.registry.Registry.from_plugins()
    cfg = resolve_config("tiny", ["train.task=g2p"], reg)
    model = build_model(reg, reg.variants["baseline"], cfg.model, seed=3).eval()
    return model, reg.task("g2p").eval_set(32, 6, VOCAB, 1)


def test_beam_of_one_is_greedy_decoding(tiny_model):
    model, data = tiny_model
    annotated = greedy_decode(model, data.src, 21)  # the Annotated greedy_decode, not stopped at the end symbol
    want = [_strip(r) for r in annotated.tolist()]
    assert greedy(model, data.src, 21) == want == beam_search(model, data.src, 21, 1)
    assert len(set(want)) > 1  # a random model does not emit one constant row


class ForkModel:
    """A decoder whose next-token distribution depends only on the last token (a table): after the
    start symbol 3 (0.6) or 4 (0.4); after 3 ten tokens at 0.1 each; after 4 the end symbol at 0.99.
    Greedy takes 3 then a 0.1 token (0.06 at best); the best sequence is 4, end (about 0.4)."""

    def __init__(self, vocab=20):
        self.cfg = SimpleNamespace(vocab=vocab)
        p = torch.full((vocab, vocab), 1e-6)
        p[START, 3], p[START, 4] = 0.6, 0.4
        p[3, 5:15] = 0.1
        p[4, END] = 0.99
        p[5:15, END] = 1.0
        self.table = (p / p.sum(1, keepdim=True)).log()
        self.mask_style = SimpleNamespace(src_mask=lambda s, pad: None, tgt_mask=lambda y, pad: None)
        self.embed = SimpleNamespace(logits=lambda h: self.table[h[:, 0].long()])

    def encode(self, src, mask):
        return src.float().unsqueeze(-1)

    def decode(self, memory, src_mask, ys, tgt_mask):
        return ys.float().unsqueeze(-1)  # (B, t, 1): the "hidden state" is the token id

    def score(self, seq):
        prev, total = START, 0.0
        for t in tuple(seq) + (END,):
            total, prev = total + float(self.table[prev, t]), t
        return total


def test_beam_search_finds_a_better_sequence_than_greedy():
    model = ForkModel()
    src = torch.ones(2, 3, dtype=torch.long)
    g, b = greedy(model, src, 5), beam_search(model, src, 5, 2)
    assert g[0][0] == 3 and b == [(4,), (4,)]
    assert model.score(b[0]) > model.score(g[0]) + 1.5 and math.isclose(math.exp(model.score(b[0])), 0.4, rel_tol=1e-3)


def test_tiny_g2p_run_reports_wer_and_per(tmp_path):
    run_dir = harness.run(variants=["baseline"], task="g2p", preset="tiny", seeds=1, check=False,
                          overrides={"train.beam": 2, "train.steps": 8, "train.eval_every": 4},
                          results_dir=str(tmp_path), device="cpu")
    trials = pd.read_csv(run_dir / "trials.csv")
    assert list(trials.status) == ["ok"] and list(trials.decoding) == ["beam 2"]
    assert trials.wer.between(0, 1).all() and (trials.per >= 0).all()
    assert math.isclose(float(trials.exact_match[0]), 1 - float(trials.wer[0]))
    report = (run_dir / "report.md").read_text()
    assert "WER IQM [95% CI]" in report and "PER IQM [95% CI]" in report and "beam 2" in report
    assert "compares on **wer**" in report  # g2p's primary metric, without --metric
    assert "EM≥0.99" not in report and not (run_dir / "steps_to_solve.png").exists()  # no "solved" columns
    from PIL import Image

    width, height = Image.open(run_dir / "final_metrics.png").size  # four panels, two a row: no strip
    assert width / height <= 3, (width, height)
    assert "test words of CMUdict" in report and "0/64" in report
    curves = pd.read_csv(run_dir / "curves.csv")
    assert curves[curves.split == "dev"].wer.notna().all()
    summary = harness.load_run(run_dir).summary
    assert {"wer", "wer_low", "per"} <= set(summary.columns)


def test_settings_bench_runs_both_arms_on_their_own_streams():
    from harness.perf.settings import run_settings_bench, settings_table

    reg = harness.registry.Registry.from_plugins()
    new = resolve_config("tiny", ["train.task=g2p", "train.bucket=True", "train.batch=32"], reg)
    old = new.override({"train.bucket": False})
    rows = run_settings_bench(reg.variants["baseline"], old, new, "fp32", "fp32", "train.bucket=False", reg,
                              torch.device("cpu"), steps=3, warmup=1)
    assert [r["arm"] for r in rows] == ["old", "new"] and rows[0]["vs_old"] == 1.0
    assert rows[0]["padded_per_step"] == 32 * 21 > rows[1]["padded_per_step"]  # fixed width vs trimmed
    assert all(r["steps_timed"] == 3 and r["tokens_per_s"] > 0 for r in rows)
    assert "x old" in settings_table(rows).columns


@pytest.mark.parametrize("bucket", [True, False])
def test_a_groups_index_fast_path_stacks_the_same_tensors_as_its_batches(lex, bucket):
    """``index_stream`` + ``stack_indices`` (a trial group's one gather for all seeds) give, step by
    step, exactly the stacked seeds' ``batches()``: the same rows, widths (natural and the captured
    step's buckets), padding and label-token counts."""
    from harness.vstep import bucket_widths, stack_batches

    task = G2PTask()
    cfg = get_preset("g2p").override({"train.batch": 16, "train.bucket": bucket})
    full = task.widths(cfg.train.seq_len)
    seeds = [0, 1, 5]
    streams = [task.batches(cfg, torch.Generator().manual_seed(s)) for s in seeds]
    draws = [task.index_stream(cfg, torch.Generator().manual_seed(s)) for s in seeds]
    for step in range(40):
        batches, idx = [next(s) for s in streams], [next(d) for d in draws]
        fit = (lambda s, t: bucket_widths(s, t, full)) if step % 2 else (lambda s, t: None)
        s, t = max(b.src.size(1) for b in batches), max(b.tgt.size(1) for b in batches)
        want = stack_batches(batches, fit(s, t), pad=cfg.model.pad)
        got, ntokens = task.stack_indices(cfg, idx, fit)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), step
        assert ntokens == [b.ntokens for b in batches]


def test_a_g2p_group_trains_the_same_with_and_without_the_index_fast_path(monkeypatch):
    from harness import group as group_mod
    from harness.trial import TrialSpec

    cfg = get_preset("g2p").override({"model.N": 1, "model.d_model": 16, "model.d_ff": 32, "train.batch": 16,
                                      "train.steps": 6, "train.eval_every": 3, "train.eval_sequences": 24})
    specs = [TrialSpec("baseline", s, cfg.to_dict(), device="cpu", threads=1) for s in (0, 1)]
    calls, real = [], G2PTask.stack_indices
    monkeypatch.setattr(G2PTask, "stack_indices", lambda self, *a: calls.append(1) or real(self, *a))
    fast = group_mod.run_group(specs)
    assert len(calls) == 7  # the probe on the first batches, then one per step
    monkeypatch.setattr(G2PTask, "index_stream", lambda self, cfg, gen: None)
    slow = group_mod.run_group(specs)
    for f, s in zip(fast, slow):
        assert f.row["vectorised"] == 2 and f.row["status"] == "ok"
        assert [r["loss"] for r in f.curve] == [r["loss"] for r in s.curve]
        assert {k: f.row[k] for k in ("heldout_ce", "wer", "final_train_loss")} == \
            {k: s.row[k] for k in ("heldout_ce", "wer", "final_train_loss")}
