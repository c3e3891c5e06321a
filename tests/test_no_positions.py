"""Note 004 asks "why encode positions at all?" and answers that attention "does not change when the
tokens are shuffled". Measured here on the model as a whole: without positions (``positional=nope``,
variant ``no_positions``) the encoder is permutation-equivariant and cross-attention sums over its
outputs, so shuffling the source leaves every logit unchanged (to float rounding): such a model cannot
copy or reverse, since a source and its shuffle must get the same output. The decoder keeps its
causal mask, so the target's order still matters. With the paper's positions the source's order
changes the logits. ``tests/plugins/adv_no_positions_rotates.py`` is the ablation that keeps positions
inside attention; ``check`` fails it (tests/test_adversarial.py)."""
from __future__ import annotations

import pytest
import torch

from harness.config import get_preset
from harness.model import build_model
from harness.registry import Registry


@pytest.fixture(scope="module")
def models():
    reg = Registry.from_plugins()
    cfg = get_preset("quick").model
    return {name: build_model(reg, reg.variants[name], cfg, seed=0).eval() for name in ("baseline", "no_positions")}


def _logits(model, src, tgt):
    with torch.no_grad():
        return model(src, tgt)


def _inputs(seed: int = 0, batch: int = 6, length: int = 10, vocab: int = 11):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(1, vocab, (batch, length), generator=g)  # no padding: every position is real
    tgt = torch.randint(1, vocab, (batch, length), generator=g)
    perm = torch.randperm(length, generator=g)
    assert not torch.equal(perm, torch.arange(length))
    return src, tgt, perm


def test_without_positions_shuffling_the_source_changes_no_logit(models):
    src, tgt, perm = _inputs()
    assert not torch.equal(src, src[:, perm])
    same = (_logits(models["no_positions"], src, tgt) - _logits(models["no_positions"], src[:, perm], tgt)).abs().max()
    assert same < 1e-5, float(same)
    moved = (_logits(models["baseline"], src, tgt) - _logits(models["baseline"], src[:, perm], tgt)).abs().max()
    assert moved > 1e-2, float(moved)  # the paper's PE: the source's order reaches the output


def test_without_positions_the_target_order_still_matters(models):
    src, tgt, perm = _inputs(seed=1)
    out = _logits(models["no_positions"], src, tgt)
    shuffled = _logits(models["no_positions"], src, tgt[:, perm])
    assert (out - shuffled).abs().max() > 1e-2  # the decoder's causal mask sees the order of what came before


def test_no_positions_is_a_question_out_of_all_held_to_its_formula():
    reg = Registry.from_plugins()
    v = reg.variants["no_positions"]
    base = dict(reg.variants["baseline"].slots)
    assert v.group == "questions" and dict(v.slots) == {**base, "positional": "nope"} != base  # one slot changed
    assert "no_positions" not in {x.name for x in reg.select(["all"])}
    assert reg.component("positional", "nope").reference == "no_positions"
