"""The held-out split of the copy task: evaluation sequences never occur in training (by
construction, and measured), batches keep their documented layout, the same seed gives the same
data, every content length >= 2 has sequences on both sides of the split and length 1 is all
training (see the module docstring of harness.tasks.copy for why)."""
from __future__ import annotations

import itertools

import pytest
import torch

from harness.config import get_preset
from harness.errors import ConfigError, UnknownNameError
from harness.tasks.base import END, PAD, START, count_overlap
from harness.tasks.splits import DEV_SEQUENCES
from harness.tasks.copy import HELDOUT_K, eval_lengths, heldout_classes, is_heldout, split_class

from .tasks_by_name import eval_set, heldout_note, heldout_overlap, make_batch, training_sources

#: (task, seq_len, vocab): the presets' shapes plus small vocabularies (K < HELDOUT_K) and
#: the shortest lengths
SHAPES = [("copy", 10, 11), ("copy", 6, 11), ("copy", 2, 11), ("copy", 4, 5), ("copy", 3, 7), ("copy", 8, 16),
          ("copy_fixed", 10, 11), ("copy_fixed", 3, 4), ("copy_fixed", 5, 30)]
IDS = [f"{t}-L{L}-V{V}" for t, L, V in SHAPES]


def lengths(src: torch.Tensor) -> torch.Tensor:
    return (src != PAD).sum(1)


@pytest.mark.parametrize("preset", ["quick", "tiny", "paper"])
def test_evaluation_set_never_occurs_in_the_training_stream(preset):
    cfg = get_preset(preset)
    overlap, n = heldout_overlap(cfg, seed=0)
    assert (overlap, n) == (0, cfg.train.eval_sequences)
    note = heldout_note(cfg, seed=0)
    assert f"0/{n}" in note and "disjoint from training by construction" in note
    assert f"dev set: {DEV_SEQUENCES} " in note and f"0/{DEV_SEQUENCES}, with the test set: 0/{DEV_SEQUENCES}" in note
    if preset == "quick":
        assert note.startswith("test set: 1000 sequences of content length 2-10, disjoint")


def test_the_overlap_measure_finds_sequences_drawn_like_training():
    """Drawn the old way (from the training distribution, the eval seed), the evaluation set
    shares every short sequence with seed 0's training stream: the measure is not vacuous
    (the pre-split code measured 397/1000 here, every sequence of content length 1-3)."""
    cfg = get_preset("quick")
    tc = cfg.train
    same_distribution = make_batch(tc.task, tc.eval_sequences, tc.seq_len, cfg.model.vocab,
                                   torch.Generator().manual_seed(tc.eval_seed)).src
    overlap = count_overlap(same_distribution, training_sources(cfg, seed=0))
    short = int((lengths(same_distribution) <= 3).sum())
    assert short <= overlap < tc.eval_sequences
    first = next(training_sources(cfg, seed=0))
    assert count_overlap(first, first) == first.size(0)
    assert count_overlap(eval_set(tc.task, 50, tc.seq_len, cfg.model.vocab, 1).src, first) == 0


@pytest.mark.parametrize("task,seq_len,vocab", SHAPES, ids=IDS)
def test_training_batches_and_evaluation_sets_lie_on_their_own_side(task, seq_len, vocab):
    g = torch.Generator().manual_seed(0)
    for batch in (1, 7, 128):
        assert not is_heldout(task, make_batch(task, batch, seq_len, vocab, g).src, vocab).any()
    for seed in (0, 1234):
        assert is_heldout(task, eval_set(task, 300, seq_len, vocab, seed).src, vocab).all()


def assert_layout(task, b, batch, seq_len, vocab, shortest=1):
    if task == "copy":
        assert b.src.shape == (batch, seq_len) and b.tgt.shape == b.tgt_y.shape == (batch, seq_len + 1)
        n = lengths(b.src)  # (B,)
        pos = torch.arange(seq_len)
        assert ((n >= shortest) & (n <= seq_len)).all()
        content = pos < n[:, None]  # (B, L)
        assert (b.src[~content] == PAD).all() and ((b.src[content] >= 3) & (b.src[content] < vocab)).all()
        assert (b.tgt[:, 0] == START).all()
        assert torch.equal(b.tgt[:, 1:], b.tgt_y[:, :-1])  # decoder input = labels shifted right
        for row, k in zip(range(batch), n.tolist()):
            expected = torch.cat([b.src[row, :k], torch.tensor([END]), torch.zeros(seq_len - k, dtype=torch.long)])
            assert torch.equal(b.tgt_y[row], expected)
    else:
        assert b.src.shape == (batch, seq_len) and b.tgt.shape == b.tgt_y.shape == (batch, seq_len - 1)
        assert (b.src[:, 0] == START).all() and ((b.src >= 1) & (b.src < vocab)).all()
        assert torch.equal(b.tgt, b.src[:, :-1]) and torch.equal(b.tgt_y, b.src[:, 1:])
    assert b.src.dtype == b.tgt.dtype == b.tgt_y.dtype == torch.int64


@pytest.mark.parametrize("task,seq_len,vocab", SHAPES, ids=IDS)
def test_batches_keep_the_documented_layout(task, seq_len, vocab):
    assert_layout(task, make_batch(task, 64, seq_len, vocab, torch.Generator().manual_seed(3)), 64, seq_len, vocab)
    assert_layout(task, eval_set(task, 64, seq_len, vocab, 3), 64, seq_len, vocab, shortest=2)


@pytest.mark.parametrize("task", ["copy", "copy_fixed"])
def test_the_same_seed_gives_the_same_batches(task):
    def stream(seed):
        g = torch.Generator().manual_seed(seed)
        return [make_batch(task, 128, 10, 11, g) for _ in range(5)]

    a, b, c = stream(0), stream(0), stream(1)
    for x, y in zip(a, b):
        assert torch.equal(x.src, y.src) and torch.equal(x.tgt, y.tgt) and torch.equal(x.tgt_y, y.tgt_y)
    assert not torch.equal(a[0].src, a[1].src) and not torch.equal(a[0].src, c[0].src)
    assert torch.equal(eval_set(task, 200, 10, 11, 7).src, eval_set(task, 200, 10, 11, 7).src)
    assert not torch.equal(eval_set(task, 200, 10, 11, 7).src, eval_set(task, 200, 10, 11, 8).src)


@pytest.mark.parametrize("task,seq_len,vocab", SHAPES, ids=IDS)
def test_every_content_length_from_2_has_sequences_on_both_sides(task, seq_len, vocab):
    """The first content token runs through every hash class: for any rest of the row, between
    floor(S/K) and ceil(S/K) of the S first tokens are held out (so >= 1), the others not (>= 1);
    content length 1 is all training."""
    low = 3 if task == "copy" else 1
    symbols, k = vocab - low, heldout_classes(task, seq_len, vocab)
    g = torch.Generator().manual_seed(0)
    lead = 0 if task == "copy" else 1
    for n in (range(2, seq_len + 1) if task == "copy" else [seq_len - 1]):
        rows = torch.randint(low, vocab, (20, seq_len), generator=g)  # 20 random rests of length n
        if task == "copy":
            rows[:, n:] = PAD
        else:
            rows[:, 0] = START
        fiber = rows.repeat_interleave(symbols, 0)  # (20 * S, L)
        fiber[:, lead] = torch.arange(low, vocab).repeat(20)
        held = is_heldout(task, fiber, vocab).view(20, symbols).sum(1)  # (20,)
        assert ((held >= symbols // k) & (held <= -(-symbols // k))).all(), (n, held)
        assert (held >= 1).all() and (held <= symbols - 1).all()
    if task == "copy":
        single = torch.zeros(symbols, seq_len, dtype=torch.long)
        single[:, 0] = torch.arange(low, vocab)
        assert not is_heldout(task, single, vocab).any()


def test_quick_preset_training_has_every_length_and_evaluation_every_length_from_2():
    cfg = get_preset("quick")
    tc, v = cfg.train, cfg.model.vocab
    train = lengths(make_batch(tc.task, 2000, tc.seq_len, v, torch.Generator().manual_seed(0)).src)
    held = lengths(eval_set(tc.task, tc.eval_sequences, tc.seq_len, v, tc.eval_seed).src)
    assert set(train.tolist()) == set(range(1, tc.seq_len + 1))
    assert set(held.tolist()) == set(range(2, tc.seq_len + 1)) and eval_lengths("copy", tc.seq_len) == (2, 10)
    pairs = torch.tensor([[a, b] + [PAD] * (tc.seq_len - 2) for a in range(3, v) for b in range(3, v)])
    assert int(is_heldout("copy", pairs, v).sum()) == 13  # of the 64 length-2 sequences


def test_each_side_is_uniform_within_a_length_and_lengths_stay_uniform():
    """Rejection keeps the draw uniform: lengths 1..L equally likely, and the length-1 training
    and length-2 training sequences equally likely (loose 5-sigma bounds on 40,000 rows)."""
    src = make_batch("copy", 40_000, 4, 11, torch.Generator().manual_seed(0)).src
    counts = torch.bincount(lengths(src), minlength=5)[1:].float()  # (4,)
    assert ((counts - 10_000).abs() < 5 * (40_000 * 0.25 * 0.75) ** 0.5).all(), counts
    twos = src[lengths(src) == 2, :2]  # (about 10,000, 2)
    counts = torch.bincount((twos[:, 0] - 3) * 8 + twos[:, 1] - 3, minlength=64).float()  # (64,)
    pairs = torch.tensor([[a, b, 0, 0] for a in range(3, 11) for b in range(3, 11)])
    held = is_heldout("copy", pairs, 11)
    assert (counts[held] == 0).all() and int(held.sum()) == 13
    kept = counts[~held]
    expected = twos.size(0) / kept.numel()
    assert ((kept - expected).abs() < 5 * expected ** 0.5).all(), kept


def test_about_one_in_k_sequences_is_held_out():
    rows = torch.randint(3, 11, (50_000, 10), generator=torch.Generator().manual_seed(0))
    share = float(is_heldout("copy", rows, 11).float().mean())
    assert abs(share - 1 / HELDOUT_K) < 0.01
    assert split_class("copy", rows, 11).unique().tolist() == list(range(HELDOUT_K))


def test_vocabularies_without_a_split_are_refused():
    with pytest.raises(ConfigError, match="vocab >= 5"):
        make_batch("copy", 4, 6, 4, torch.Generator().manual_seed(0))
    with pytest.raises(ConfigError, match="seq_len >= 3"):
        eval_set("copy_fixed", 4, 2, 11, 0)
    with pytest.raises(ConfigError, match="seq_len >= 2"):
        make_batch("copy", 4, 1, 11, torch.Generator().manual_seed(0))
    with pytest.raises(UnknownNameError, match="unknown task 'revers'; did you mean 'reverse'"):
        make_batch("revers", 4, 6, 11, torch.Generator().manual_seed(0))
    assert [heldout_classes("copy", 6, v) for v in (5, 6, 7, 8, 9, 11)] == [2, 3, 4, 5, 5, 5]
    assert list(itertools.islice(training_sources(get_preset("tiny"), 0), 1))[0].shape == (16, 6)



def test_the_overlap_measure_runs_on_one_thread_and_restores_the_callers(monkeypatch):
    """heldout_overlap's batches are small ops (a second intra-op thread made them 24x slower on a
    busy 2-core machine): it draws them on one thread and gives the caller its thread count back."""
    from .tasks_by_name import task_named
    from harness.tasks.splits import heldout_overlap

    task, seen = task_named("copy"), []
    draw = task.make_batch

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return draw(*args, **kwargs)

    monkeypatch.setattr(task, "make_batch", spy)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert heldout_overlap(task, get_preset("tiny"), 0) == (0, 64)
        assert seen == [1] * get_preset("tiny").train.steps  # the training stream, on one thread
        assert torch.get_num_threads() == 2  # restored
    finally:
        torch.set_num_threads(before)
