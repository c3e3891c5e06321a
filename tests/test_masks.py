"""Both mask conventions block what they should, and the faithful bugs do not."""
import pytest
import torch

from variants.bugs import DiscardedFillMask, Uint8InvertMask
from variants.mask import AdditiveMask, BoolMask, ValidLensMask


def probs(style, scores, mask):
    return style.apply(scores, mask).softmax(-1)


@pytest.mark.parametrize("style", [BoolMask(), AdditiveMask(), ValidLensMask()], ids=["bool", "additive", "valid_lens"])
def test_causal_and_padding_blocked(style):
    tgt = torch.tensor([[1, 5, 6, 2, 0, 0]])
    src = torch.tensor([[5, 6, 0, 0]])
    scores_t = torch.randn(1, 2, 6, 6)
    p = probs(style, scores_t, style.tgt_mask(tgt, 0))
    future = torch.ones(6, 6, dtype=torch.bool).triu(1)
    assert (p[..., future] == 0).all(), "a query attends to a future position"
    scores_s = torch.randn(1, 2, 6, 4)
    p = probs(style, scores_s, style.src_mask(src, 0))
    assert (p[..., 2:] == 0).all(), "a query attends to a padded source position"
    torch.testing.assert_close(p.sum(-1), torch.ones(1, 2, 6))


def test_bool_and_additive_give_identical_probabilities():
    tgt = torch.tensor([[1, 5, 6, 2, 0, 0], [1, 7, 2, 0, 0, 0]])
    scores = torch.randn(2, 3, 6, 6)
    a = probs(BoolMask(), scores, BoolMask().tgt_mask(tgt, 0))
    b = probs(AdditiveMask(), scores, AdditiveMask().tgt_mask(tgt, 0))
    assert torch.equal(a, b)


def test_fully_masked_row_policy():
    scores = torch.zeros(1, 1, 1, 3)
    src = torch.tensor([[0, 0, 0]])
    assert torch.allclose(probs(BoolMask(), scores, BoolMask().src_mask(src, 0)), torch.full((1, 1, 1, 3), 1 / 3))
    assert torch.isnan(probs(AdditiveMask(), scores, AdditiveMask().src_mask(src, 0))).all()


def test_faithful_bugs_leak():
    tgt = torch.tensor([[1, 5, 6, 2]])
    scores = torch.randn(1, 1, 4, 4)
    future = torch.ones(4, 4, dtype=torch.bool).triu(1)
    for bug in (DiscardedFillMask(), Uint8InvertMask()):
        p = probs(bug, scores, bug.tgt_mask(tgt, 0))
        assert (p[..., future] > 0).any(), f"{type(bug).__name__} should leak future positions"
