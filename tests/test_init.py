"""The ``init`` slot: schemes that draw each canonical tensor from (seed, name) alone, the default bitwise the
harness's start before the slot existed, each scheme's factors, components that learn where they sit and keep
a start of their own, a DeepNet written as a plugin from the docs, and ``check`` treating a change of ``init``
as the same function at equal weights."""
from __future__ import annotations

import json
import math
import zlib

import pytest
import torch
from torch import nn

import harness
from harness.checks import CHECK_MODEL
from harness.checks.contracts import check_component, check_contracts
from harness.checks.runs import CheckSession
from harness.checks.whole import equivalence_classes
from harness.cli import main as cli_main
from harness.config import ModelConfig
from harness.init_schemes import tensor_generator
from harness.model import build_model, canonical_state_dict, load_canonical_state_dict
from harness.plugins import PluginSpec
from harness.registry import Component, Registry, Variant
from harness.report import training_classes

from .conftest import ROOT

PLUGINS = ROOT / "tests" / "plugins"
CFG = ModelConfig(d_model=64, h=4, d_ff=128, N=3, vocab=40, max_len=24)
SCHEMES = ["xavier", "torch_default", "d2l", "nn_transformer", "gpt2", "small", "t_fixup", "deepnet"]


@pytest.fixture(scope="module")
def reg():
    return Registry.from_plugins(PluginSpec(files=[str(PLUGINS / "own_init_ffn.py"), str(PLUGINS / "deepnet_plugin.py")],
                                            strict=True))


def start(reg, slots: dict, seed: int = 0, cfg: ModelConfig = CFG) -> dict[str, torch.Tensor]:
    model = build_model(reg, Variant("x", slots), cfg, seed=seed)
    return {k: v.detach().clone() for k, v in canonical_state_dict(model).items()}


def old_canonical_init(model: nn.Module, seed: int) -> None:
    """``harness.model.canonical_init`` as it was before the ``init`` slot (commit 7d92c8c), verbatim."""
    state = canonical_state_dict(model)
    fresh = {}
    for name in sorted(state):
        t = state[name]
        g = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
        new = t.detach().to("cpu", torch.float32).clone()
        if t.dim() > 1:
            nn.init.xavier_uniform_(new, generator=g)
        elif name.endswith("bias"):
            w = state.get(name[:-4] + "weight")
            if w is not None and w.dim() == 2:
                bound = 1.0 / math.sqrt(w.shape[1])
                new.uniform_(-bound, bound, generator=g)
        fresh[name] = new
    load_canonical_state_dict(model, fresh)


# --------------------------------------------------------------------------- the default and the pairing

@pytest.mark.parametrize("variant", ["baseline", "shared_embeddings", "packed_attention", "gqa_attention",
                                     "learned_positions", "swiglu_ffn", "modern", "seed_001"])
def test_the_default_init_is_bitwise_the_harness_start_before_the_slot(reg, variant):
    """The old rule redraws every tensor it sets from (seed, name) alone: applied to a model built now it must change
    nothing (and at another seed it must change something, so the comparison can fail)."""
    model = build_model(reg, reg.variants[variant], CFG, seed=5)
    assert reg.variants[variant].slots["init"] == "xavier"
    built = {k: v.clone() for k, v in model.state_dict().items()}
    old_canonical_init(model, 5)
    assert [k for k, v in model.state_dict().items() if not torch.equal(v, built[k])] == []
    old_canonical_init(model, 6)
    assert any(not torch.equal(v, built[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_scheme_starts_variants_sharing_a_layout_equal(reg, scheme):
    """Four attention layouts (four Linears, folded heads, one packed qkv, SDPA) hold one canonical layout: with the
    same scheme and seed they start bitwise equal; another seed moves the start."""
    starts = [start(reg, {"init": scheme, "attention": a}, seed=2) for a in ("annotated", "d2l", "sdpa_packed", "torch")]
    assert all(torch.equal(starts[0][k], s[k]) for s in starts[1:] for k in starts[0])
    other = start(reg, {"init": scheme}, seed=3)
    assert not torch.equal(other["encoder.layers.0.self_attn.w_q.weight"], starts[0]["encoder.layers.0.self_attn.w_q.weight"])


def test_every_builtin_scheme_conforms_to_the_slot_and_the_contract_catches_a_broken_one(reg):
    keys = sorted(k for k in reg.components if k[0] == "init" and not k[1].startswith("adv"))
    assert [k[1] for k in keys] == sorted(SCHEMES)
    assert {r.name: r.verdict for r in check_contracts(reg, keys, CHECK_MODEL)} == dict.fromkeys(SCHEMES, "conforms")

    class Constant:
        def init(self, site, current, generator):
            return nn.init.constant_(current, 0.01) if len(site.shape) > 1 or site.role == "bias" else current

    class KeepsBiases:
        def init(self, site, current, generator):
            return nn.init.xavier_uniform_(current, generator=generator) if len(site.shape) > 1 else current

    class WrongShape:
        def init(self, site, current, generator):
            return torch.zeros(3)

    verdicts = {name: check_component(Component(name, "init", lambda ctx, c=cls: c()), CHECK_MODEL)[0]
                for name, cls in (("constant", Constant), ("keeps_biases", KeepsBiases), ("wrong_shape", WrongShape))}
    assert {n: r.verdict for n, r in verdicts.items()} == dict.fromkeys(verdicts, "violates its slot")
    assert "ignores its generator" in verdicts["constant"].diagnosis
    assert "keeps the value the module was built with" in verdicts["keeps_biases"].diagnosis
    assert "must return a tensor of shape" in verdicts["wrong_shape"].diagnosis


# --------------------------------------------------------------------------- each scheme's factors

def _normal(std):
    return lambda shape, g: torch.empty(shape).normal_(0.0, std, generator=g)


def _uniform(bound, scale=1.0):
    return lambda shape, g: torch.empty(shape).uniform_(-bound, bound, generator=g).mul_(scale)


def _const(value):
    return lambda shape, g: torch.full(shape, float(value))


def expected_draws(scheme: str) -> dict[str, object]:
    """name -> how the papers say it is drawn, for ``CFG`` (D = 64, d_ff = 128, N = 3, V = 40), written from the
    sources, not from variants/init.py."""
    d, f, n = CFG.d_model, CFG.d_ff, CFG.N
    xavier = math.sqrt(6 / (2 * d))  # (D, D)
    enc, dec = "encoder.layers.1.", "decoder.layers.2."
    if scheme == "torch_default":  # nn.Linear: kaiming_uniform_(a = sqrt 5) = U(+-1/sqrt(fan_in)); nn.Embedding N(0, 1)
        return {enc + "self_attn.w_q.weight": _uniform(1 / math.sqrt(d)), dec + "feed_forward.w_2.weight":
                _uniform(1 / math.sqrt(f)), "embed.src.weight": _normal(1.0),
                "embed.generator.weight": _uniform(1 / math.sqrt(d)), enc + "feed_forward.w_2.bias": _uniform(1 / math.sqrt(f))}
    if scheme == "d2l":  # xavier_uniform_ on nn.Linear weights; embeddings N(0, 1)
        return {enc + "self_attn.w_v.weight": _uniform(xavier), "embed.tgt.weight": _normal(1.0),
                enc + "self_attn.w_v.bias": _uniform(1 / math.sqrt(d))}
    if scheme == "nn_transformer":  # in_proj_weight (3D, D): bound sqrt(6 / 4D); in_proj_bias, out_proj.bias 0
        return {enc + "self_attn.w_k.weight": _uniform(math.sqrt(6 / (4 * d))), dec + "src_attn.w_o.weight": _uniform(xavier),
                enc + "self_attn.w_q.bias": _const(0), dec + "src_attn.w_o.bias": _const(0),
                enc + "feed_forward.w_1.bias": _uniform(1 / math.sqrt(d))}
    if scheme == "gpt2":  # N(0, 0.02); c_proj N(0, 0.02 / sqrt(residual layers)): 2N encoder, 3N decoder; biases 0
        return {enc + "self_attn.w_q.weight": _normal(0.02), "embed.src.weight": _normal(0.02),
                enc + "self_attn.w_o.weight": _normal(0.02 / math.sqrt(2 * n)),
                dec + "src_attn.w_o.weight": _normal(0.02 / math.sqrt(3 * n)),
                dec + "feed_forward.w_2.weight": _normal(0.02 / math.sqrt(3 * n)), enc + "feed_forward.w_1.bias": _const(0)}
    if scheme == "small":  # attention std sqrt(2 / 5D); FFN Xavier normal; embeddings std D^-1/2; biases 0
        return {enc + "self_attn.w_q.weight": _normal(math.sqrt(2 / (5 * d))),
                dec + "src_attn.w_o.weight": _normal(math.sqrt(2 / (5 * d))),
                enc + "feed_forward.w_1.weight": _normal(math.sqrt(2 / (d + f))), "embed.src.weight": _normal(d ** -0.5),
                dec + "self_attn.w_v.bias": _const(0)}
    if scheme == "t_fixup":  # xavier; embeddings N(0, D^-1/2); x (9N)^-1/4 decoder v, w, MLP and embeddings;
        dec_s, enc_s = (9 * n) ** -0.25, 0.67 * n ** -0.25  # x 0.67 N^-1/4 encoder v, w, MLP
        return {enc + "self_attn.w_q.weight": _uniform(xavier), enc + "self_attn.w_v.weight": _uniform(xavier, enc_s),
                enc + "feed_forward.w_2.weight": _uniform(math.sqrt(6 / (d + f)), enc_s),
                dec + "src_attn.w_o.weight": _uniform(xavier, dec_s), dec + "self_attn.w_k.weight": _uniform(xavier),
                "embed.tgt.weight": lambda s, g: torch.empty(s).normal_(0.0, d ** -0.5, generator=g).mul_(dec_s)}
    if scheme == "deepnet":  # xavier_normal_ gain beta on ffn, v_proj, out_proj; gain 1 on q_proj, k_proj
        beta_e, beta_d = 0.87 * (n ** 4 * n) ** (-1 / 16), (12 * n) ** -0.25
        return {enc + "self_attn.w_v.weight": _normal(beta_e * math.sqrt(2 / (2 * d))),
                enc + "feed_forward.w_1.weight": _normal(beta_e * math.sqrt(2 / (d + f))),
                dec + "src_attn.w_o.weight": _normal(beta_d * math.sqrt(2 / (2 * d))),
                dec + "self_attn.w_q.weight": _normal(math.sqrt(2 / (2 * d))), "embed.src.weight": _uniform(
                    math.sqrt(6 / (CFG.vocab + d)))}
    raise KeyError(scheme)


@pytest.mark.parametrize("scheme", [s for s in SCHEMES if s != "xavier"])
def test_each_scheme_draws_its_sources_factors(reg, scheme):
    got = start(reg, {"init": scheme}, seed=4)
    for name, law in expected_draws(scheme).items():
        want = law(tuple(got[name].shape), tensor_generator(4, name))
        torch.testing.assert_close(got[name], want, rtol=1e-6, atol=1e-7, msg=lambda m, n=name: f"{scheme} {n}: {m}")
    assert torch.equal(got["encoder.layers.0.sublayer.0.norm.weight"], torch.ones(CFG.d_model))  # LayerNorm kept


def test_the_deepnorm_residual_takes_deepnets_alpha_from_where_it_sits(reg):
    model = build_model(reg, reg.variants["deepnet"], CFG)
    n = CFG.N
    assert {b.alpha for layer in model.encoder.layers for b in layer.sublayer} == {0.81 * (n ** 4 * n) ** (1 / 16)}
    assert {b.alpha for layer in model.decoder.layers for b in layer.sublayer} == {(3 * n) ** 0.25}
    x, sub = torch.randn(2, 5, CFG.d_model), torch.tanh
    block = model.decoder.layers[0].sublayer[0].eval()
    torch.testing.assert_close(block(x, sub), block.norm((3 * n) ** 0.25 * x + sub(x)))


# --------------------------------------------------------------------------- where a component sits; its own start

def test_a_component_learns_its_stack_layer_and_depth_from_the_build_context(reg):
    model = build_model(reg, reg.variants["own_init_ffn"], CFG)
    assert [layer.feed_forward.where for layer in model.encoder.layers] == [("encoder", i, 3) for i in range(3)]
    assert [layer.feed_forward.where for layer in model.decoder.layers] == [("decoder", i, 3) for i in range(3)]


@pytest.mark.parametrize("scheme", ["xavier", "gpt2", "t_fixup"])
def test_a_component_that_initialises_itself_keeps_its_start(reg, scheme):
    """own_init_ffn's init_weights sets a ramp, N(0, 0.5) from its generator and biases 0.25: the harness must keep
    every value (this fails when the scheme overwrites them), and the rest of the model starts as the baseline."""
    mine, baseline = start(reg, {"feed_forward": "own_init_ffn", "init": scheme}, 7), start(reg, {"init": scheme}, 7)
    for stack in ("encoder", "decoder"):
        for i in range(CFG.N):
            ffn = f"{stack}.layers.{i}.feed_forward."
            ramp = torch.linspace(-0.3, 0.3, CFG.d_ff * CFG.d_model).view(CFG.d_ff, CFG.d_model)
            assert torch.equal(mine[ffn + "w_1.weight"], ramp)
            w_2 = torch.empty(CFG.d_model, CFG.d_ff).normal_(0.0, 0.5, generator=tensor_generator(7, ffn + "w_2.weight"))
            assert torch.equal(mine[ffn + "w_2.weight"], w_2)
            assert torch.equal(mine[ffn + "w_1.bias"], torch.full((CFG.d_ff,), 0.25))
    assert all(torch.equal(mine[k], baseline[k]) for k in baseline if ".feed_forward." not in k)


def test_a_start_set_in_the_constructor_alone_is_overwritten_as_documented(reg):
    ctor, baseline = start(reg, {"feed_forward": "ctor_init_ffn"}, 7), start(reg, {}, 7)
    assert all(torch.equal(ctor[k], baseline[k]) for k in baseline)


# --------------------------------------------------------------------------- DeepNet written as a plugin

def test_the_deepnet_plugin_written_from_the_docs_starts_as_the_builtin_deepnet(reg):
    for seed in (0, 1):
        plugin, builtin = start(reg, {"norm": "deepnet_plugin_norm", "feed_forward": "deepnet_plugin_ffn",
                                      "attention": "deepnet_plugin_attn"}, seed), start(reg, reg.variants["deepnet"].slots, seed)
        assert plugin.keys() == builtin.keys()
        assert [k for k in builtin if not torch.equal(plugin[k], builtin[k])] == []
    model, ref = build_model(reg, reg.variants["deepnet_plugin"], CFG), build_model(reg, reg.variants["deepnet"], CFG)
    for stack in ("encoder", "decoder"):
        alphas = [b.alpha for layer in getattr(model, stack).layers for b in layer.sublayer]
        assert alphas == [b.alpha for layer in getattr(ref, stack).layers for b in layer.sublayer]


def test_the_deepnet_plugins_start_has_the_papers_scale(reg):
    """The plugin's initial weights against beta * xavier_normal's std, measured (D = 64, N = 3; 4096 to 8192 draws
    per matrix: the std within 5 %), and its residual alpha against Table 1."""
    got, n, d, f = start(reg, reg.variants["deepnet_plugin"].slots, 3), CFG.N, CFG.d_model, CFG.d_ff
    beta_e, beta_d = 0.87 * (n ** 5) ** (-1 / 16), (12 * n) ** -0.25
    for name, std in (("encoder.layers.0.self_attn.w_v.weight", beta_e * math.sqrt(1 / d)),
                      ("encoder.layers.2.feed_forward.w_2.weight", beta_e * math.sqrt(2 / (d + f))),
                      ("decoder.layers.1.src_attn.w_o.weight", beta_d * math.sqrt(1 / d)),
                      ("decoder.layers.0.self_attn.w_q.weight", math.sqrt(1 / d))):
        assert float(got[name].std()) == pytest.approx(std, rel=0.05), name
    assert beta_e < 1 and beta_d < 1


def test_the_deepnet_plugin_passes_check(reg):
    res = check_contracts(reg, [("norm", "deepnet_plugin_norm"), ("feed_forward", "deepnet_plugin_ffn"),
                                 ("attention", "deepnet_plugin_attn")], CHECK_MODEL)
    assert all(r.ok for r in res), [r.reason() for r in res if not r.ok]
    assert {r.verdict for r in res if r.slot == "norm"} == {"differs as declared"}


# --------------------------------------------------------------------------- check and list

def test_check_compares_variants_differing_only_in_init_at_equal_weights(reg):
    """The checker loads one reference state into every variant: a change of init alone is the same function (the
    same logits, bitwise, on its batch) and lands in the baseline's class; pre-norm does not."""
    names = ["baseline", "gpt2_init", "torch_default_init", "t_fixup_init", "pre_norm"]
    session = CheckSession.create(reg)
    session.load_state([reg.variants[n] for n in names])
    runs = {n: session.run(reg.variants[n]) for n in names[:3]}
    assert torch.equal(runs["baseline"].logits, runs["gpt2_init"].logits)
    assert torch.equal(runs["baseline"].logits, runs["torch_default_init"].logits)
    classes = equivalence_classes(reg, [reg.variants[n] for n in names])
    assert sorted(next(c for c in classes if "baseline" in c)) == sorted(names[:4])


def test_list_shows_the_init_slot_its_schemes_and_the_group(capsys):
    assert cli_main(["list"]) == 0
    out = capsys.readouterr().out
    assert "init: how the weights start" in out
    for scheme in SCHEMES:
        assert f"| init         | {scheme}" in out
    after = out.split("| init         | xavier")[1].splitlines()
    assert "(default)" in after[1][:30]  # the default, marked on the cell's second line
    assert "gpt2_init" in out and "[group:init]" in out and "norm=deepnorm, init=deepnet" in out


def test_the_training_classes_split_a_check_class_by_the_init_scheme():
    check = {"classes": [["baseline", "gpt2_init", "d2l_attention"], ["pre_norm"]],
             "starts": {"baseline": "xavier", "gpt2_init": "gpt2", "d2l_attention": "xavier", "pre_norm": "xavier"}}
    assert training_classes(check) == [["baseline", "d2l_attention"], ["gpt2_init"], ["pre_norm"]]
    assert training_classes({"classes": check["classes"]}) == check["classes"]  # recorded before starts: unsplit
    assert training_classes(None) == []


def test_a_run_compares_a_change_of_init_instead_of_calling_it_the_same_function(tmp_path):
    folder = harness.run(variants=["baseline", "gpt2_init", "d2l_attention"], seeds=2, preset="tiny",
                         overrides={"train.steps": 4}, results_dir=tmp_path)
    check = json.loads((folder / "config.json").read_text())["check"]
    assert sorted(map(sorted, check["classes"])) == [["baseline", "d2l_attention", "gpt2_init"]]
    assert check["starts"] == {"baseline": "xavier", "d2l_attention": "xavier", "gpt2_init": "gpt2"}
    summary = harness.load_run(folder).summary.set_index("variant")
    assert bool(summary.loc["d2l_attention", "same_function"]) and not bool(summary.loc["gpt2_init", "same_function"])
    assert summary.loc["gpt2_init", "verdict"] != "same function"
    assert "start from other weights" in (folder / "report.md").read_text()
