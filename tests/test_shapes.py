"""Components with canonical parameters of their own shapes: grouped-query / multi-query attention
(``w_k``, ``w_v`` of (n_kv d_k, D)) and a SwiGLU at inner width d_ff beside the built-in one at 2/3 d_ff.
The checker never crashes on them, never calls them bad input, holds each to its own contract and puts
each in an equivalence class of its own, with the reason."""
from __future__ import annotations

import pytest

from harness import checks
from harness.config import ModelConfig
from harness.checks.render import render_text
from harness.errors import ConfigError
from harness.plugins import PluginSpec
from harness.registry import Registry

WIDE_SWIGLU = '''
import torch
from torch import nn
from torch.nn import functional as F
from harness import Component, Variant, hookimpl

class WideSwiGLU(nn.Module):
    """w_down(silu(w_gate x) * w_up x) with inner width d_ff (not 2/3 d_ff)."""
    def __init__(self, ctx):
        super().__init__()
        d, f = ctx.cfg.d_model, ctx.cfg.d_ff
        self.w_gate, self.w_up, self.w_down = ctx.linear(d, f), ctx.linear(d, f), ctx.linear(f, d)
        self.dropout = nn.Dropout(ctx.cfg.dropout)
    def forward(self, x):
        return self.w_down(self.dropout(F.silu(self.w_gate(x)) * self.w_up(x)))

@hookimpl
def harness_add_components():
    return [Component("wide_swiglu", "feed_forward", WideSwiGLU, "SwiGLU at inner width d_ff", "test",
                      differs="gated SwiGLU at inner width d_ff", reference="ffn_swiglu")]

@hookimpl
def harness_add_variants():
    return [Variant("wide_swiglu", {"feed_forward": "wide_swiglu"})]
'''


def test_a_swiglu_at_width_d_ff_beside_the_built_in_one_is_checked_not_refused(tmp_path):
    f = tmp_path / "wide_swiglu.py"
    f.write_text(WIDE_SWIGLU)
    reg = Registry.from_plugins(PluginSpec(files=[str(f)], strict=True))
    report = checks.run_checks(reg, reg.select(["wide_swiglu", "swiglu_ffn"]))
    assert report.failures() == []
    (pair,) = report.pairs
    assert pair.verdict == "not comparable" and "feed_forward.w_down.weight has shape (32, 42) in swiglu_ffn but (32, 64)" in pair.notes[0]
    assert sorted(report.classes()) == [["swiglu_ffn"], ["wide_swiglu"]]
    assert "{wide_swiglu}: in a class of its own (no canonical counterpart" in render_text(report)


def test_grouped_query_attention_is_held_to_the_grouped_formula_and_to_mha_through_repeated_rows():
    reg = Registry.from_plugins()
    report = checks.run_checks(reg, reg.select(["gqa_attention", "mqa_attention"]))
    assert report.failures() == []
    attention = [r for r in report.components if r.slot == "attention"]
    assert {r.name for r in attention} == {"gqa", "mqa"} and {r.verdict for r in attention} == {"conforms"}
    assert {r.verdict for r in report.mha} == {"equivalent"}
    assert {r.verdict for r in report.transformer} == {"not comparable"}
    assert any("K/V heads shared by groups" in r.detail for r in report.transformer)


@pytest.mark.parametrize("n_kv, ok", [(0, True), (1, True), (2, True), (4, True), (3, False), (-1, False)])
def test_n_kv_heads_must_divide_h(n_kv, ok):
    cfg = ModelConfig(h=4, d_model=32, n_kv_heads=n_kv)
    if ok:
        assert cfg.validate() is cfg
    else:
        with pytest.raises(ConfigError, match="n_kv_heads must divide h"):
            cfg.validate()


def test_alibi_written_from_the_docs_slope_rule_passes_at_six_heads():
    """At h = 6 (not a power of 2) the docs' rule (interleaved slopes from 2n heads) is the check's formula
    and the built-in's: the plugin passes and is measured the built-in's function (one class)."""
    from .conftest import ROOT

    reg = Registry.from_plugins(PluginSpec(files=[str(ROOT / "tests" / "plugins" / "good_alibi.py")], strict=True))
    cfg = ModelConfig(N=1, d_model=36, h=6, d_ff=32, dropout=0.1, vocab=11, pad=0, max_len=32)
    report = checks.run_checks(reg, reg.select(["good_alibi", "alibi_positions"]), cfg)
    assert report.failures() == []
    assert sorted(report.classes()) == [["alibi_positions", "good_alibi"]]


def test_alibi_with_the_power_of_2_rule_at_six_heads_is_named(tmp_path):
    from harness.checks.contracts import check_positional

    from .conftest import ROOT

    src = (ROOT / "tests" / "plugins" / "good_alibi.py").read_text()
    wrong = src.replace("    n = 1 << (h.bit_length() - 1)\n    return geometric(n) + geometric(2 * n)[0::2][: h - n]",
                        "    return geometric(h)")
    assert wrong != src
    f = tmp_path / "alibi_geometric.py"
    f.write_text(wrong)
    reg = Registry.from_plugins(PluginSpec(files=[str(f)], strict=True))
    cfg = ModelConfig(N=1, d_model=36, h=6, d_ff=32, vocab=11, max_len=32)
    failed = [r for r in check_positional(reg.component("positional", "good_alibi"), cfg) if not r.ok]
    assert failed and "ALiBi slopes 2^(-8i/h) for h = 6, not a power of 2" in failed[0].reason()
