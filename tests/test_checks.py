"""Equivalence checks, mask probes and the conformance kit (harness.testing), used as plugin authors would."""
import textwrap

import pandas as pd
import pytest
import torch

from harness import checks
from harness.cli import main as cli_main
from harness.errors import ConfigError
from harness.runmeta import RunMeta
from harness.registry import Variant
from harness.testing import (assert_differs, assert_equivalent, assert_flagged, assert_mask_component,
                             assert_mask_probes_pass, assert_matches_multihead_attention, assert_matches_nn_transformer,
                             assert_ties_hold, check_variant_contract, contract_failures, load_registry,
                             small_config)
from harness import testing

#: The conformance kit's pytest fixtures, used here by name as a plugin author's suite would.
harness_registry, harness_config = testing.harness_registry, testing.harness_config

from .conftest import builtin_variant_names, cli_in_process

VARIANTS = builtin_variant_names()
BUGS = ["bug_001_discarded_mask", "bug_001_uint8_invert", "bug_001_unexpanded_mask", "bug_002_kv_query_len",
        "bug_002_narrow_ffn"]

PLUGIN = textwrap.dedent('''
    """Test plugin: one correct attention, one without 1/sqrt(d_k), one mask with the opposite convention,
    one embedding whose tie breaks on .to()."""
    import math

    import torch
    from torch import nn

    from harness import Component, Variant, hookimpl


    class PluginAttention(nn.Module):
        scale = True

        def __init__(self, ctx):
            super().__init__()
            d = ctx.cfg.d_model
            self.h, self.apply_mask = ctx.cfg.h, ctx.mask.apply
            self.w_q, self.w_k, self.w_v, self.w_o = (ctx.linear(d, d) for _ in range(4))

        def forward(self, q, k, v, mask=None):
            b, tq, tk = q.size(0), q.size(1), k.size(1)
            qh = self.w_q(q).view(b, tq, self.h, -1).transpose(1, 2)  # (B, H, Tq, d_k)
            kh = self.w_k(k).view(b, tk, self.h, -1).transpose(1, 2)  # (B, H, Tk, d_k)
            vh = self.w_v(v).view(b, tk, self.h, -1).transpose(1, 2)  # (B, H, Tk, d_k)
            scores = qh @ kh.transpose(-2, -1)
            if self.scale:
                scores = scores / math.sqrt(qh.size(-1))
            if mask is not None:
                scores = self.apply_mask(scores, mask)
            return self.w_o((scores.softmax(-1) @ vh).transpose(1, 2).reshape(b, tq, -1))


    class NoScaleAttention(PluginAttention):
        scale = False


    class BlockMask:
        """Keep-masks applied as if True meant blocked (nn.MultiheadAttention's convention)."""

        def src_mask(self, src, pad):
            return (src != pad)[:, None, None, :]

        def tgt_mask(self, tgt, pad):
            t = tgt.size(1)
            return (tgt != pad)[:, None, None, :] & torch.ones(t, t, dtype=torch.bool, device=tgt.device).tril()

        def apply(self, scores, mask):
            return scores.masked_fill(mask, -1e9)


    class FragileTiedEmbeddings(nn.Module):
        """Generator tied to the target table by sharing .data: the tie does not survive .to()."""

        def __init__(self, ctx):
            super().__init__()
            v, d = ctx.cfg.vocab, ctx.cfg.d_model
            self.src_lut, self.tgt_lut, self.generator = nn.Embedding(v, d), nn.Embedding(v, d), nn.Linear(d, v)
            self.generator.weight.data = self.tgt_lut.weight.data

        def src(self, ids):
            return self.src_lut(ids)

        def tgt(self, ids):
            return self.tgt_lut(ids)

        def logits(self, x):
            return self.generator(x)


    @hookimpl
    def harness_add_components():
        return [Component("plugin_mha", "attention", PluginAttention, "correct test attention"),
                Component("plugin_noscale", "attention", NoScaleAttention, "forgets 1/sqrt(d_k)"),
                Component("plugin_inverted", "mask", lambda ctx: BlockMask(), "True treated as blocked"),
                Component("plugin_fragile", "embedding", FragileTiedEmbeddings, "tie through .data")]


    @hookimpl
    def harness_add_variants():
        return [Variant("plugin_ok", {"attention": "plugin_mha"}),
                Variant("plugin_noscale", {"attention": "plugin_noscale"}),
                Variant("plugin_inverted", {"mask": "plugin_inverted"}),
                Variant("plugin_fragile", {"embedding": "plugin_fragile"})]
''')


@pytest.fixture(scope="module")
def plugin_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("plugin") / "check_test_plugin.py"
    path.write_text(PLUGIN)
    return path


@pytest.fixture(scope="module")
def plugin_registry(plugin_file):
    return load_registry(files=[plugin_file])


# --------------------------------------------------------------------------- the kit on the built-ins

@pytest.mark.parametrize("name", VARIANTS, ids=VARIANTS)
def test_every_builtin_variant_honours_the_contract(harness_registry, name):
    check_variant_contract(harness_registry, name)


@pytest.mark.parametrize("other", ["d2l_attention", "torch_attention", "additive_mask"])
def test_attention_and_mask_styles_are_equivalent_to_baseline(harness_registry, other):
    res = assert_equivalent(harness_registry, "baseline", other)
    assert res.grads_compared > 40  # every canonical parameter, not just the logits
    assert res.logits.golden < 1e-10  # the float64 runs agree: the same function, not just close


@pytest.mark.parametrize("slots", [{"attention": "happy_llm"}, {"mask": "valid_lens"},
                                   {"attention": "d2l", "mask": "valid_lens", "projections": "bias_free"}],
                         ids=["happy_llm", "valid_lens", "d2l+valid_lens+bias_free"])
def test_components_outside_the_named_variants_are_equivalent(harness_registry, slots):
    base = Variant("ref", {k: v for k, v in slots.items() if k == "projections"})
    assert_equivalent(harness_registry, base, Variant("other", slots))


@pytest.mark.parametrize("a,b", [("baseline", "pre_norm"), ("baseline", "shared_embeddings"),
                                 ("pre_norm", "seed_000")])
def test_declared_differences_are_measured(harness_registry, a, b):
    res = assert_differs(harness_registry, a, b)
    assert res.logits.max_abs > 100 * res.logits.threshold
    assert res.logits.golden > 1e-3  # the difference survives float64: it is real, not rounding


def test_expected_relation_from_declarations(harness_registry):
    v = harness_registry.variants
    groups = checks.registry_groups(harness_registry)
    assert checks.expected_relation(v["baseline"], v["torch_attention"], groups) == ("equivalent", [])
    # seed_003's components all declare nothing (held to their slots' references) ...
    assert checks.expected_relation(v["baseline"], v["seed_003"], groups) == ("equivalent", [])
    # ... but bias-free projections cannot hold the reference state's biases: a layout difference
    res = checks.compare_variants(harness_registry, "baseline", "seed_003")
    assert res.expected == "differs" and any(d.startswith("parameter layout") for d in res.declared)
    rel, declared = checks.expected_relation(v["baseline"], v["seed_002"], groups)
    assert {d.split(":")[0] for d in declared} == {"norm", "layer_norm"}


@pytest.mark.parametrize("attention", ["annotated", "d2l", "torch", "happy_llm"])
@pytest.mark.parametrize("mask", ["bool", "additive", "valid_lens"])
def test_attention_components_match_multihead_attention(harness_registry, attention, mask):
    res = assert_matches_multihead_attention(harness_registry, attention, mask)
    self_attn = next(r for r in res if "self" in r.reference)
    if mask == "valid_lens":  # causal-only at padded query rows, which never reach the loss
        assert self_attn.padded_rows > 1e-3
    else:
        assert self_attn.padded_rows < 1e-5


def test_bias_free_attention_matches_bias_free_multihead_attention(harness_registry):
    res = assert_matches_multihead_attention(harness_registry, "d2l", "valid_lens", "bias_free")
    assert all("bias" not in r.grad_max.name for r in res)


@pytest.mark.parametrize("name", ["baseline", "pre_norm", "seed_003", "seed_004"])
def test_stacks_match_nn_transformer(harness_registry, name):
    res = assert_matches_nn_transformer(harness_registry, name)
    if harness_registry.variants[name].resolved()["norm"] == "post":
        stock = res[0]
        assert stock.verdict == checks.NOT_COMPARABLE and "final LayerNorm" in stock.detail


def test_stacks_at_the_g2p_and_deep_sizes_match_nn_transformer(harness_registry):
    """At the g2p and deep model sizes one FFN input of seed_004 / seed_003 sat within float32 rounding of 0 on the
    reference draw (2.8e-8 in float32, -2.0e-7 in float64): the ReLU took the other side, one gradient entry moved by
    0.07-0.2 while the outputs agreed to 1e-6, and check failed both built-ins against nn.Transformer. A gap in the
    gradients alone is now confirmed on a second draw before it counts (how the draws fall depends on the CPU's
    rounding, so the note is not asserted here: the retry's logic is, below)."""
    from harness.config import get_preset

    for name, preset in (("seed_004", "g2p"), ("seed_003", "deep")):
        assert_matches_nn_transformer(harness_registry, name, get_preset(preset).model)


def _diff(name: str, gap: float, golden: float = 0.0):
    return checks.TensorDiff(name, gap, 1e-6, 1e-5, golden, False)


@pytest.mark.parametrize("draws, ok, note", [
    ([(0.0, 0.2), (0.0, 0.0)], True, "a rounding event at a kink"),  # a gradient gap that does not recur: rounding
    ([(0.0, 0.2), (0.0, 0.2)], False, "the backward is not the derivative of the forward"),  # it recurs: a fault
    ([(0.5, 0.2), (0.0, 0.0)], False, ""),  # the outputs differ: never drawn again
])
def test_a_gradient_gap_with_matching_outputs_is_drawn_again(harness_registry, monkeypatch, draws, ok, note):
    from harness.checks import transformer as tr
    from harness.checks.inputs import CHECK_MODEL
    from harness.checks.runs import reference_state

    seen = []

    def fake(registry, variant, cfg, state, structure, device, dtype, seed, tol):
        out, grad = draws[len(seen)]
        seen.append(seed)
        return _diff("decoder output", out), [_diff("decoder.layers.0.feed_forward.w_1.bias", grad, golden=grad)]

    monkeypatch.setattr(tr, "_stack_diffs", fake)
    v = harness_registry.variants["pre_norm"]
    state, _ = reference_state(harness_registry, [v], CHECK_MODEL, 0)
    res = [r for r in tr.compare_with_nn_transformer(harness_registry, v, CHECK_MODEL, state)
           if r.verdict != checks.NOT_COMPARABLE]
    assert len(res) == 1 and res[0].ok is ok and note in res[0].detail, res[0].explain()
    assert seen == ([0, 1] if draws[0][0] == 0.0 else [0])


def test_a_pair_whose_gradients_alone_differ_is_drawn_again(harness_registry, monkeypatch):
    """The pairs between variants get the second draw too: a first comparison with the logits within and one gradient
    far off (what a ReLU kink flip gives) is repeated on seed + 1 and that comparison decides, with a note."""
    import dataclasses

    from harness.checks import sections

    real, calls = sections.compare_outputs, []

    def first_one_off(ra, rb, expected, declared, tol, keep):
        res = real(ra, rb, expected, declared, tol, keep)
        calls.append(res)
        if len(calls) > 1:
            return res
        off = dataclasses.replace(res.grad_worst, max_abs=1.0)
        return dataclasses.replace(res, verdict=checks.UNEXPECTED, ok=False, grad_max=off, grad_worst=off)

    monkeypatch.setattr(sections, "compare_outputs", first_one_off)
    report = checks.run_checks(harness_registry, harness_registry.select(["baseline", "additive_mask"]), task_rows=None)
    (pair,) = report.pairs
    assert pair.ok and "a rounding event at a kink" in " ".join(pair.notes), pair.notes
    assert len(calls) == 2


def test_nn_transformer_says_why_it_cannot_compare(harness_registry):
    with pytest.raises(AssertionError, match="layer_norm=annotated declares a difference from nn.LayerNorm"):
        assert_matches_nn_transformer(harness_registry, "seed_000")


def test_nn_transformer_mapping_names():
    assert checks.nn_transformer_name("decoder.layers.1.src_attn.w_k.weight") == \
        ("decoder.layers.1.multihead_attn.in_proj_weight", 1)
    assert checks.nn_transformer_name("encoder.layers.0.sublayer.1.norm.bias") == ("encoder.layers.0.norm2.bias", None)
    with pytest.raises(KeyError):
        checks.nn_transformer_name("embed.src.weight")


@pytest.mark.parametrize("mask,row", [("bool", "uniform"), ("additive", "nan"), ("valid_lens", "uniform")])
def test_mask_components_and_fully_masked_rows(harness_registry, mask, row):
    assert_mask_component(harness_registry, mask, fully_masked_row=row)


def test_shared_embeddings_stay_tied(harness_registry, harness_config):
    res = assert_ties_hold(harness_registry, "shared_embeddings", expect_tied=True)
    assert res.groups == [["embed.generator.weight", "embed.src.weight", "embed.tgt.weight"]]
    assert res.params_per_use - res.params_unique == 2 * harness_config.vocab * harness_config.d_model
    assert res.untied_logits < 1e-5 and res.untied_grad < 1e-5
    assert_ties_hold(harness_registry, "baseline", expect_tied=False)


# --------------------------------------------------------------------------- the study notes' bugs

@pytest.mark.parametrize("name,reason", [
    ("bug_001_discarded_mask", "causal mask not applied"),
    ("bug_001_uint8_invert", "blocks every key"),
    ("bug_001_unexpanded_mask", "crashes on the padded check batch (B=6, S=29, T=32): RuntimeError"),
    ("bug_002_kv_query_len", "crashes on the padded check batch (B=6, S=29, T=32): RuntimeError"),
    ("bug_002_narrow_ffn", "inner width 32 where the config's d_ff is 64"),
], ids=BUGS)
def test_faithful_bugs_are_flagged_with_a_reason(harness_registry, name, reason):
    res = assert_flagged(harness_registry, name)
    assert any(reason in r for r in res.reasons), res.reasons


def test_clean_variant_is_not_flagged(harness_registry):
    assert checks.bug_reasons(harness_registry, harness_registry.variants["pre_norm"]).reasons == []
    with pytest.raises(AssertionError, match="no check flags"):
        assert_flagged(harness_registry, "pre_norm")


# --------------------------------------------------------------------------- the kit catches a plugin's mistakes

def test_correct_plugin_attention_passes_the_kit(plugin_registry):
    assert_matches_multihead_attention(plugin_registry, "plugin_mha")
    assert_equivalent(plugin_registry, "baseline", "plugin_ok")
    check_variant_contract(plugin_registry, "plugin_ok")


def test_missing_scale_is_caught(plugin_registry):
    with pytest.raises(AssertionError, match="differs unexpectedly"):
        assert_equivalent(plugin_registry, "baseline", "plugin_noscale")
    with pytest.raises(AssertionError, match="does not match nn.MultiheadAttention"):
        assert_matches_multihead_attention(plugin_registry, "plugin_noscale")


def test_inverted_mask_convention_is_caught(plugin_registry):
    failures = contract_failures(plugin_registry, "plugin_inverted")
    assert any("causal mask not applied" in f for f in failures), failures
    with pytest.raises(AssertionError, match="plugin_inverted"):
        assert_mask_probes_pass(plugin_registry, "plugin_inverted")
    with pytest.raises(AssertionError, match="lets .* through|blocks"):
        assert_mask_component(plugin_registry, "plugin_inverted")


def test_fragile_tie_is_caught(plugin_registry):
    with pytest.raises(AssertionError, match=r"ties changed after \.to"):
        assert_ties_hold(plugin_registry, "plugin_fragile")


# --------------------------------------------------------------------------- the report and the tolerance table

def test_tolerance_table_and_threshold():
    tol = checks.get_tolerance("fp32", "cuda:0")
    assert tol is checks.TOLERANCES[("fp32", "cuda")]
    assert tol.threshold(1e-9) == tol.atol and tol.threshold(1e-3) == pytest.approx(tol.fudge * 1e-3)
    with pytest.raises(ConfigError, match="fp16"):
        checks.get_tolerance("fp16", "cpu")


def test_equivalent_option_parsing():
    groups = checks.merge_groups(checks.parse_equivalent(["attention=annotated,mine"]),
                                 {"attention": (frozenset({"annotated", "d2l"}),)})
    assert checks.same_function("attention", "mine", "d2l", groups)
    with pytest.raises(ConfigError, match="SLOT=A,B"):
        checks.parse_equivalent(["attention=annotated"])
    with pytest.raises(ConfigError, match="unknown slot"):
        checks.merge_groups({"attn": [{"a", "b"}]})


def test_crash_descriptions_skip_the_check_machinery_only():
    """describe_exception skips the frames of every harness/checks/ module except those that call into a
    component on its own (the contracts and the probes), as it skipped the frames of the single checks.py."""
    from pathlib import Path

    from harness.checks import inputs

    modules = {str(p) for p in Path(inputs.__file__).parent.glob("*.py")}
    named = {m for m in modules if Path(m).name.startswith(("contract", "probes"))}
    assert named and inputs._MACHINERY == frozenset(modules - named)


def test_run_checks_classes_matrix_and_files(harness_registry):
    vs = harness_registry.select(["baseline", "d2l_attention", "pre_norm", "bug_001_discarded_mask"])
    rep = checks.run_checks(harness_registry, vs, small_config(N=1))
    assert rep.classes() == [["baseline", "d2l_attention"], ["pre_norm"]]
    assert rep.failures() == []
    assert [b.variant for b in rep.bugs if b.flagged] == ["bug_001_discarded_mask"]
    matrix = checks.matrix_frame(rep).set_index("variant")
    assert matrix.loc["baseline", "pre_norm"].startswith("≠")
    if not torch.cuda.is_available():
        assert {r.verdict for r in rep.devices} == {"no CUDA"}
    df = checks.results_frame(rep)
    assert {"pair", "probe", "mask component", "nn.MultiheadAttention", "nn.Transformer", "tied parameters",
            "device", "faithful bug"} <= set(df["section"])
    md = checks.render_markdown(rep, RunMeta.from_dict({"run_id": "x", "environment": {}}))
    assert "## Equivalence matrix" in md and "final LayerNorm" in md and "bug_001_discarded_mask" in md


def test_a_compact_matrix_too_wide_for_the_terminal_is_printed_in_blocks_of_columns():
    from harness.checks.render import matrix_blocks

    names = [f"{i} variant_{i:02d}" for i in range(1, 29)]  # all + group:modern is 26-28 variants
    frame = pd.DataFrame([{"variant": n, **{str(j): "—" if i == j else "≠0.058" for j in range(1, 29)}}
                          for i, n in enumerate(names, 1)])
    blocks = matrix_blocks(frame, 120)
    assert len(blocks) == 3
    seen = []
    for block in blocks:
        head, table = block.split("\n\n")
        lines = table.splitlines()
        assert max(map(len, lines)) <= 120 and len(lines) == 2 + 28  # every row in every block
        cols = [c.strip() for c in lines[0].strip("|").split("|")]
        assert cols[0] == "variant" and head == f"columns {cols[1]}-{cols[-1]} of 28:"
        seen += cols[1:]
    assert seen == [str(j) for j in range(1, 29)]  # each column once, in order
    assert [len(b.splitlines()[2].split("|")) - 3 for b in blocks] == [10, 9, 9]  # even, not 12+12+4
    # a matrix that fits is one table with no heading; one column wider than the terminal gets its own block
    assert matrix_blocks(frame.iloc[:5, :6], 120) == [frame.iloc[:5, :6].to_markdown(index=False, tablefmt="github")]
    wide = frame.iloc[:3, :4].assign(**{"2": "x" * 130})
    assert [b.split(":")[0] for b in matrix_blocks(wide, 120)] == ["columns 1-1 of 3", "columns 2-2 of 3",
                                                                  "columns 3-3 of 3"]


def test_cli_check_all_with_bugs_end_to_end(tmp_path):
    proc = cli_in_process("check", "--variants", "all,bug*", "-q", "--results-dir", str(tmp_path), "--run-id", "c")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "{additive_mask, baseline, d2l_attention, torch_attention}" in proc.stdout
    assert "0 result(s) do not match their declaration" in proc.stdout
    lines = proc.stdout.splitlines()
    assert max(map(len, lines[:-1])) <= 120  # all but the last line's paths; the matrix numbered and compact
    row = next(line for line in lines if line.startswith("| 2 baseline"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # additive, -, d2l, pre_norm. d2l's heads reach the matmuls in another layout: bitwise equal on some CPUs
    # (Intel Xeon), equal within the threshold on others (AMD EPYC): the same class either way.
    assert cells[:3] == ["2 baseline", "=", "—"] and cells[3] in ("=", "≈") and cells[4].startswith("≠")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checks"]  # records apart from the runs
    df = pd.read_csv(tmp_path / "checks" / "c" / "checks.csv")
    bugs = df[df["section"] == "faithful bug"]
    assert set(bugs["subject"]) == set(BUGS) and (bugs["verdict"] == "flagged").all()
    pairs = df[df["section"] == "pair"]
    assert len(pairs) == len(VARIANTS) * (len(VARIANTS) - 1) // 2 and pairs["ok"].all()
    assert "## Faithful-bug variants" in (tmp_path / "checks" / "c" / "checks.md").read_text()


def test_cli_exit_1_when_a_declared_equivalence_fails(plugin_file, tmp_path, capsys):
    rc = cli_main(["--plugin", str(plugin_file), "check", "--variants", "baseline,plugin_noscale", "-q",
                   "--device", "cpu", "--set", "model.N=1", "--equivalent", "attention=annotated,plugin_noscale",
                   "--results-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "baseline vs plugin_noscale: differs unexpectedly" in out


@pytest.mark.parametrize("argv,msg", [
    (["--variants", "baselin"], "unknown variant 'baselin'"),
    (["--set", "train.steps=3"], "check builds models only"),
    (["--equivalent", "attention=annotated,nope"], "unknown attention component 'nope'"),
    (["--set", "model.max_len=5"], "check batch lengths"),
])
def test_cli_bad_input_exit_2(tmp_path, capsys, argv, msg):
    rc = cli_main(["check", *argv, "-q", "--device", "cpu", "--results-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and msg in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cpu_and_cuda_agree(harness_registry):
    vs = harness_registry.select(["baseline", "pre_norm", "torch_attention"])
    rep = checks.run_checks(harness_registry, vs, device="cuda")
    assert rep.failures() == []
    assert all(r.verdict in (checks.IDENTICAL, checks.EQUIVALENT) for r in rep.devices)
    assert_equivalent(harness_registry, "baseline", "torch_attention", device="cuda")
