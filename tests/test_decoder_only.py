"""The decoder-only and prefix-LM assemblers (harness/decoder_only.py, the ``architecture`` slot): packing, the
stack against PyTorch's nn.TransformerEncoder, the masks of every mask style, and the faults the checks and the run
gate must name in a one-stack model (tests/plugins/adv_lm_causal_peek.py, adv_prefix_sees_target.py)."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from harness import train as T
from harness.checks.inputs import CHECK_MODEL
from harness.checks.pairs import EQUIVALENT, IDENTICAL, NOT_COMPARABLE
from harness.checks.transformer_lm import compare_lm_with_torch
from harness.config import get_preset
from harness.decoder_only import DecoderOnly, PrefixLM, pack, prefix_keep, source_lengths
from harness.errors import PluginError
from harness.model import build_model
from harness.plugins import PluginSpec
from harness.registry import Component, Registry, Variant
from harness.testing import reference_state
from harness.tasks.base import prefix_logits

from .conftest import ROOT, cli_in_process

PLUGINS = ROOT / "tests" / "plugins"


def _plugin_registry(name: str) -> Registry:
    return Registry.from_plugins(PluginSpec(files=[str(PLUGINS / f"{name}.py")], strict=True))


def test_pack_puts_the_target_right_after_each_source_and_the_padding_last():
    src = torch.tensor([[5, 6, 7, 0], [8, 0, 9, 0], [0, 0, 0, 0]])  # an interior pad stays; an all-pad source
    tgt = torch.tensor([[1, 3, 4], [1, 5, 0], [1, 6, 2]])
    x_src, x_tgt = src[..., None].float(), tgt[..., None].float() + 100
    ids, x, n, index = pack(src, tgt, x_src, x_tgt, pad=0)
    assert n.tolist() == [3, 3, 0] and torch.equal(source_lengths(src, 0), n)
    assert ids.tolist() == [[5, 6, 7, 1, 3, 4, 0], [8, 0, 9, 1, 5, 0, 0], [1, 6, 2, 0, 0, 0, 0]]
    assert torch.equal(x.gather(1, index[..., None])[..., 0], x_tgt[..., 0])  # the target, where index says
    assert torch.equal(x[0, :3, 0], x_src[0, :3, 0])


def test_the_three_assemblers_and_their_variants():
    reg = Registry.from_plugins()
    cfg = get_preset("tiny").model
    kinds = {name: type(build_model(reg, reg.variants[name], cfg, seed=0)) for name in ("gpt", "prefix_lm", "modern_gpt")}
    assert kinds == {"gpt": DecoderOnly, "prefix_lm": PrefixLM, "modern_gpt": DecoderOnly}
    assert {v.name for v in reg.select(["group:architecture"])} == {"gpt", "prefix_lm", "modern_gpt"}
    assert not {"gpt", "prefix_lm", "modern_gpt"} & {v.name for v in reg.select(["all"])}, "the main job changed"
    gpt = build_model(reg, reg.variants["gpt"], cfg, seed=0)
    assert gpt.cfg.max_len == 2 * cfg.max_len  # a source and a target of max_len each
    assert not any(k.startswith("encoder.") or ".src_attn." in k for k, _ in gpt.named_parameters())


@pytest.mark.parametrize("name", ["gpt", "prefix_lm"])
def test_teacher_forced_logits_equal_the_prefix_only_ones(name):
    """A one-stack model scored as the harness scores it: the whole-target forward's logits at each target position
    equal the prefix-only ones (no later target token reaches them), so training and evaluation agree."""
    reg = Registry.from_plugins()
    model = build_model(reg, reg.variants[name], CHECK_MODEL.validate(), seed=3).eval()
    src = torch.tensor([[5, 6, 7, 0], [8, 9, 4, 3]])
    tgt = torch.tensor([[1, 5, 6, 7, 0], [1, 8, 9, 2, 4]])
    with torch.no_grad():
        whole = model(src, tgt)
        prefix = prefix_logits(model, src, tgt, tgt != 0, 0)
    keep = tgt != 0
    assert torch.allclose(whole[keep], prefix[keep], atol=1e-5)


def test_prefix_lm_is_decoder_only_at_one_layer_and_not_at_two():
    """With N = 1 a target query reads the source's embeddings, which no mask touches, so the prefix LM's target
    logits are the decoder-only model's (what ``check`` reports as one class at the quick preset); from N = 2 on the
    source's bidirectional states reach the target."""
    reg = Registry.from_plugins()
    src, tgt = torch.tensor([[5, 6, 7, 0], [8, 9, 4, 3]]), torch.tensor([[1, 5, 6, 7], [1, 8, 9, 2]])
    gaps = {}
    for n_layers in (1, 2):
        cfg = replace(get_preset("quick").model, N=n_layers)
        a, b = (build_model(reg, reg.variants[v], cfg, seed=0).eval() for v in ("gpt", "prefix_lm"))
        with torch.no_grad():
            gaps[n_layers] = float((a(src, tgt) - b(src, tgt)).abs().max())
    assert gaps[1] < 1e-6 < 1e-2 < gaps[2], gaps


@pytest.mark.parametrize("slots", [{"architecture": "decoder_only"}, {"architecture": "prefix_lm"},
                                   {"architecture": "decoder_only", "norm": "pre"},
                                   {"architecture": "prefix_lm", "mask": "additive"},
                                   {"architecture": "decoder_only", "attention": "d2l", "mask": "valid_lens"}],
                         ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_the_stack_equals_nn_transformer_encoder_with_the_same_mask(slots):
    reg = Registry.from_plugins()
    v = Variant("probe", slots)
    state, _ = reference_state(reg, [v], CHECK_MODEL, 0)
    (res,) = compare_lm_with_torch(reg, v, CHECK_MODEL, state)
    assert res.verdict in (IDENTICAL, EQUIVALENT), res.explain()


def test_a_prefix_mask_that_shows_the_source_the_target_differs_from_the_reference():
    reg = _plugin_registry("adv_prefix_sees_target")
    v = reg.variants["adv_prefix_sees_target"]
    state, _ = reference_state(reg, [v], CHECK_MODEL, 0)
    (res,) = compare_lm_with_torch(reg, v, CHECK_MODEL, state)
    assert res.verdict not in (IDENTICAL, EQUIVALENT, NOT_COMPARABLE), res


@pytest.mark.parametrize("mask", ["bool", "additive", "valid_lens", "bug_uint8_invert"])
def test_every_mask_style_makes_the_prefix_lm_mask(mask):
    """Each style's ``prefix_mask``, applied by the style itself, blocks exactly what :func:`prefix_keep` blocks
    (the uint8 study-note bug blocks everything, as its ``tgt_mask`` does)."""
    reg = Registry.from_plugins()
    style = reg.component("mask", mask).factory(None)
    ids = torch.tensor([[5, 6, 1, 7, 8, 0], [4, 1, 3, 0, 0, 0]])
    prefix = torch.tensor([2, 1])
    scores = torch.zeros(2, 1, 6, 6)
    blocked = style.apply(scores, style.prefix_mask(ids, 0, prefix)) < -1e5
    keep = prefix_keep(ids, 0, prefix)
    if mask == "bug_uint8_invert":
        assert bool(blocked.all())
        return
    real = (ids != 0)[:, None, :, None]  # valid_lens is causal-only at padded query rows, as in the encoder-decoder
    assert torch.equal(blocked & real, ~keep & real)


def test_sliding_window_prefix_mask_keeps_the_prefix_and_the_window():
    reg = Registry.from_plugins()
    style = reg.component("mask", "sliding_window").factory(SimpleNamespace(cfg=replace(CHECK_MODEL, window=2)))
    keep = style.prefix_mask(torch.tensor([[5, 6, 1, 7, 8, 9]]), 0, torch.tensor([2]))[0, 0]
    assert keep[5].tolist() == [True, True, False, False, True, True]  # the prefix, then i - 2 < j <= i
    assert keep[0].tolist() == [True, True, False, False, False, False]  # a source query: the prefix only


def test_a_mask_plugin_without_prefix_mask_cannot_build_a_prefix_lm():
    reg = Registry.from_plugins()

    class NoPrefix:
        def src_mask(self, src, pad):
            return (src != pad)[:, None, None, :]

        def tgt_mask(self, tgt, pad):
            return (tgt != pad)[:, None, None, :] & torch.ones(tgt.size(1), tgt.size(1), dtype=torch.bool).tril()

        def apply(self, scores, mask):
            return scores.masked_fill(mask == 0, -1e9)

    reg.components[("mask", "no_prefix")] = Component("no_prefix", "mask", lambda ctx: NoPrefix(), "test", "test",
                                                      plugin="tests")
    with pytest.raises(PluginError, match="has no prefix_mask"):
        build_model(reg, Variant("x", {"architecture": "prefix_lm", "mask": "no_prefix"}), CHECK_MODEL, seed=0)
    build_model(reg, Variant("y", {"architecture": "decoder_only", "mask": "no_prefix"}), CHECK_MODEL, seed=0)


@pytest.mark.parametrize("plugin, words", [("adv_lm_causal_peek", "it sees the future"),
                                           ("adv_prefix_sees_target", "a source position sees the target")])
def test_check_names_the_one_stack_faults(plugin, words, tmp_path):
    out = cli_in_process("check", "--plugin", str(PLUGINS / f"{plugin}.py"), "--variants", plugin,
                         "--results-dir", tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert words in " ".join((out.stdout + out.stderr).split()), out.stdout


@pytest.mark.parametrize("plugin", ["adv_lm_causal_peek", "adv_prefix_sees_target"])
def test_the_run_gate_marks_the_one_stack_faults_invalid(plugin):
    reg = _plugin_registry(plugin)
    cfg = get_preset("tiny").override({"train.steps": 3})
    model = build_model(reg, reg.variants[plugin], cfg.model, seed=0)
    metrics, _ = T.train(model, cfg, seed=0, device=torch.device("cpu"))
    assert metrics["status"] == T.INVALID, metrics


def test_schemes_count_the_residual_layers_of_one_stack():
    """GPT-2 scales w_o and w_2 by 1/sqrt(2N) in its own decoder-only model (3N is an encoder-decoder decoder's
    count); DeepNet's decoder-only row is alpha = (2N)^(1/4), beta = (8N)^(-1/4) (Wang et al. 2022, Table 1)."""
    reg = Registry.from_plugins()
    cfg = replace(CHECK_MODEL, d_model=128, h=4, N=3)
    one = build_model(reg, Variant("a", {"architecture": "decoder_only", "init": "gpt2"}), cfg, seed=0)
    two = build_model(reg, Variant("b", {"init": "gpt2"}), cfg, seed=0)
    std_one = float(one.decoder.layers[0].self_attn.linears[3].weight.std())
    std_two = float(two.decoder.layers[0].self_attn.linears[3].weight.std())
    assert abs(std_one - 0.02 / (2 * 3) ** 0.5) < 0.05 * std_one
    assert abs(std_two - 0.02 / (3 * 3) ** 0.5) < 0.05 * std_two
    deep = build_model(reg, Variant("c", {"architecture": "decoder_only", "norm": "deepnorm", "init": "deepnet"}),
                       cfg, seed=0)
    assert deep.decoder.layers[1].sublayer[0].alpha == pytest.approx((2 * 3) ** 0.25)
    w_v = deep.decoder.layers[0].self_attn.linears[2].weight
    assert float(w_v.std()) == pytest.approx((8 * 3) ** -0.25 * (2 / (2 * 128)) ** 0.5, rel=0.05)


def test_the_architecture_contract_holds_the_built_ins_and_names_a_leaking_assembler():
    """check_architecture (the slot's contract): the three built-ins conform; an assembler whose one stack attends
    everywhere (no causal mask) violates it with the future named; one whose decode path differs from forward, with
    that named."""
    from harness.checks.contract_architecture import check_architecture

    class SeesAll(DecoderOnly):
        def sequence_mask(self, ids, n):
            return self.mask_style.src_mask(ids, self.cfg.pad)  # padding only: every position sees every other

    class TwoPaths(DecoderOnly):
        def decode(self, memory, src_mask, tgt, tgt_mask=None):
            return super().decode(memory, src_mask, tgt, tgt_mask) * 0.5  # decoding and scoring see another model

    reg = Registry.from_plugins()
    for name in ("encoder_decoder", "decoder_only", "prefix_lm"):
        assert check_architecture(reg.component("architecture", name), CHECK_MODEL)[0].ok, name
    (leak,) = check_architecture(Component("sees_all", "architecture", lambda ctx: SeesAll), CHECK_MODEL)
    assert not leak.ok and "sees the future" in leak.diagnosis, leak
    (two,) = check_architecture(Component("two_paths", "architecture", lambda ctx: TwoPaths), CHECK_MODEL)
    assert not two.ok and "differs from forward" in two.diagnosis, two


def test_a_run_of_one_stack_variants_on_text_compares_them_with_gpt(tmp_path):
    """The issue's command, as a user types it: no --baseline, no `baseline` variant; the variants name gpt as what
    they are compared with (Variant.compared_with), so the run records gpt and exits 0."""
    import json

    out = cli_in_process("run", "--variants", "gpt", "modern_gpt", "--task", "text", "--preset", "tiny",
                         "--results-dir", tmp_path, "--run-id", "r", "--device", "cpu", "-q")
    assert out.returncode == 0, out.stdout + out.stderr
    meta = json.loads((tmp_path / "r" / "config.json").read_text())
    assert meta["baseline"] == "gpt"
    bad = cli_in_process("run", "--variants", "modern_gpt", "pre_norm", "--preset", "tiny", "--results-dir", tmp_path,
                         "--run-id", "r2", "--device", "cpu", "-q")
    assert bad.returncode == 2 and "--baseline NAME" in bad.stderr  # no shared choice: still asked for


def test_check_passes_the_one_stack_variants_and_classes_them_apart(tmp_path):
    """Every built-in one-stack variant passes ``check`` (positions inside attention included: RoPE and ALiBi over
    the packed sequence), and variants of different architectures are never one class."""
    from harness.api import check

    names = ["baseline", "gpt", "prefix_lm", "modern_gpt", "lm_rope_positions", "lm_alibi_positions",
             "lm_no_positions", "lm_learned_positions", "lm_packed_attention"]
    outcome = check(variants=names, device="cpu", preset="quick", overrides={"model.N": 2}, quiet=True,
                    results_dir=tmp_path)
    assert outcome.ok, outcome.report.failures()
    classes = [set(c) for c in outcome.report.classes()]
    assert {"gpt", "lm_packed_attention"} in classes  # the same function, one layout apart
    assert not any({"baseline", "gpt"} <= c or {"gpt", "prefix_lm"} <= c for c in classes)


@pytest.mark.parametrize("task", ["copy", "reverse", "sort", "copy_length", "copy_fixed", "g2p", "text"])
def test_every_task_trains_and_scores_a_one_stack_model(task):
    """Each built-in task under the decoder-only and prefix-LM architectures: a few steps, the run gate, the
    periodic evaluation with its future-leak check and the final scores, all ok (g2p with beam search)."""
    reg = Registry.from_plugins()
    extra = {"train.beam": 2} if task == "g2p" else {}
    cfg = get_preset("tiny").override({"train.task": task, "train.steps": 4, "train.eval_every": 2,
                                       "train.eval_sequences": 32, **extra})
    the_task = reg.task(task).for_config(cfg)
    cfg = the_task.fit(cfg, set())
    for name in ("gpt", "prefix_lm"):
        model = build_model(reg, reg.variants[name], cfg.model, seed=0)
        metrics, _ = T.train(model, cfg, seed=0, device=torch.device("cpu"), task=the_task)
        assert metrics["status"] == "ok", (name, metrics.get("reason"))


def test_lm_layers_sets_the_one_stack_depth_for_equal_parameters():
    """model.lm_layers = 2N gives the one stack about the encoder-decoder's parameters (T5 §3.2.2's "2L"), 0 gives
    N layers and about half; an encoder-decoder ignores it; a negative value is refused."""
    from harness.errors import ConfigError
    from harness.model import unique_parameter_count

    reg = Registry.from_plugins()
    cfg = get_preset("g2p_quick").model
    sizes = {(v, lm): unique_parameter_count(build_model(reg, reg.variants[v], replace(cfg, lm_layers=lm), seed=0))
             for v in ("baseline", "gpt") for lm in (0, 2 * cfg.N)}
    assert sizes[("baseline", 0)] == sizes[("baseline", 2 * cfg.N)]
    assert 0.4 < sizes[("gpt", 0)] / sizes[("baseline", 0)] < 0.6
    assert 0.85 < sizes[("gpt", 2 * cfg.N)] / sizes[("baseline", 0)] < 1.0  # cross-attention keeps it larger
    with pytest.raises(ConfigError, match="lm_layers"):
        replace(cfg, lm_layers=-1).validate()


@pytest.mark.parametrize("slots", [{"mask": "bug_discarded_fill"}, {"mask": "bug_uint8_invert"},
                                   {"attention": "bug_unexpanded_mask"}], ids=lambda s: next(iter(s.values())))
@pytest.mark.parametrize("architecture", ["decoder_only", "prefix_lm"])
def test_the_study_notes_mask_bugs_are_caught_in_one_stack_too(slots, architecture):
    """Note 001's discarded masked_fill and uint8 inversion let every position see the future in a one-stack model
    (the causal probe fails); its bmm attention on 4-D masks crashes there as in the encoder-decoder."""
    from harness.checks.properties.rows import gate_batch
    from harness.checks.properties.table import CHECK, ProbeInputs, run_properties

    reg = Registry.from_plugins()
    cfg = CHECK_MODEL.validate()
    model = build_model(reg, Variant("bug", {**slots, "architecture": architecture}), cfg, seed=0)
    batch = gate_batch(cfg, seed=0, long_rows=0)
    if "attention" in slots:
        with pytest.raises(RuntimeError):
            model(batch[0], batch[1])
        return
    inputs = ProbeInputs(model, batch, cfg, 1e-5, where=CHECK)
    run_properties(inputs)
    assert not inputs.results["causal leak, eval mode"].passed
    assert "sees the future" in inputs.results["causal leak, eval mode"].detail


@pytest.mark.parametrize("plugin", ["good_rope", "own_init_ffn", "new_slot"])
def test_a_plugin_written_for_the_encoder_decoder_works_unchanged_in_one_stack(plugin):
    """Plugins in tests/plugins/ written for the encoder-decoder (a from-scratch RoPE, a self-initialising FFN, a
    plugin's own slot): each variant put in a decoder-only model
    passes everything ``check`` runs on it (harness.testing.check_variant_contract), unchanged."""
    from harness.testing import check_variant_contract

    reg = _plugin_registry(plugin)
    (own,) = [v for v in reg.variants.values() if v.plugin.endswith(f"{plugin}.py")][:1]
    check_variant_contract(reg, Variant(f"{own.name}_lm", {**own.slots, "architecture": "decoder_only"}))
