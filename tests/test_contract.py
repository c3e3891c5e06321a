"""Contract tests, parametrized over every registered (non-buggy) variant."""
import pytest
import torch

from harness.model import build_model, canonical_state_dict, unique_parameter_count

from .conftest import builtin_variant_names, padded_batch

VARIANTS = builtin_variant_names()


@pytest.mark.parametrize("name", VARIANTS, ids=VARIANTS)
def test_logits_shape_finite_and_gradients(registry, small_cfg, name):
    model = build_model(registry, registry.variants[name], small_cfg, seed=0)
    src, tgt = padded_batch()
    logits = model(src, tgt)
    assert logits.shape == (src.size(0), tgt.size(1), small_cfg.vocab)
    assert torch.isfinite(logits).all()
    logits.logsumexp(-1).sum().backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, f"{pname} got no gradient"
        assert torch.isfinite(p.grad).all(), pname
        assert p.grad.abs().sum() > 0, f"{pname} has an all-zero gradient"


@pytest.mark.parametrize("name", VARIANTS, ids=VARIANTS)
def test_same_seed_same_output_other_seed_differs(registry, small_cfg, name):
    src, tgt = padded_batch()
    a = build_model(registry, registry.variants[name], small_cfg, seed=3).eval()(src, tgt)
    b = build_model(registry, registry.variants[name], small_cfg, seed=3).eval()(src, tgt)
    c = build_model(registry, registry.variants[name], small_cfg, seed=4).eval()(src, tgt)
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)


def test_paired_init_makes_attention_styles_agree(registry, small_cfg):
    """Same seed -> same canonical weights, so the three attention styles give the same logits."""
    src, tgt = padded_batch()
    outs = {n: build_model(registry, registry.variants[n], small_cfg, seed=1).eval()(src, tgt)
            for n in ("baseline", "d2l_attention", "torch_attention")}
    keep = (tgt != 0).unsqueeze(-1)
    for n in ("d2l_attention", "torch_attention"):
        torch.testing.assert_close(outs[n] * keep, outs["baseline"] * keep, rtol=1e-5, atol=1e-5)


def test_shared_embeddings_remove_exactly_2Vd_parameters(registry, small_cfg):
    sep = build_model(registry, registry.variants["baseline"], small_cfg)
    tied = build_model(registry, registry.variants["shared_embeddings"], small_cfg)
    assert unique_parameter_count(sep) - unique_parameter_count(tied) == 2 * small_cfg.vocab * small_cfg.d_model
    state = canonical_state_dict(tied)
    assert state["embed.src.weight"] is state["embed.tgt.weight"] is state["embed.generator.weight"]


def test_canonical_round_trip_is_exact(registry, small_cfg):
    from harness.model import load_canonical_state_dict

    a = build_model(registry, registry.variants["baseline"], small_cfg, seed=5)
    b = build_model(registry, registry.variants["d2l_attention"], small_cfg, seed=6)
    notes = load_canonical_state_dict(b, {k: v.detach().clone() for k, v in canonical_state_dict(a).items()})
    assert notes == []
    for k, v in canonical_state_dict(a).items():
        assert torch.equal(v, canonical_state_dict(b)[k]), k
