"""A ``norm`` component with no LayerNorm (``has_layer_norm=False``): ReZero (Bachlechner et al. 2021,
tests/plugins/rezero.py) passes ``check``, the conformance kit and ``run`` alike, and counts no LayerNorm
in ``params``; residual blocks that are not ``x + a * sublayer(x)`` fail with the fault named; and the kit
(``harness.testing``) reports exactly what ``check`` reports, also where the two disagreed before they
shared one code path."""
from __future__ import annotations

import textwrap

import pandas as pd
import pytest

from harness import checks
from harness.checks.contracts import check_contracts
from harness.cli import main as cli_main
from harness.config import get_preset
from harness.errors import PluginError
from harness.model import build_model, unique_parameter_count
from harness.registry import Component, Registry
from harness.testing import check_variant_contract, contract_failures, load_registry

from .conftest import ROOT

REZERO = ROOT / "tests" / "plugins" / "rezero.py"

#: residual blocks without LayerNorm, correct and not; each registers with has_layer_norm=False
BLOCKS = textwrap.dedent('''
    """No-LayerNorm residual blocks for tests/test_rezero.py (correct ones and faulty ones)."""
    import torch
    from torch import nn

    from harness import Component, Variant, hookimpl


    class Identity(nn.Module):
        """x + dropout(sublayer(x)): the identity ("no-norm") residual."""
        def __init__(self, ctx):
            super().__init__()
            self.dropout = nn.Dropout(ctx.cfg.dropout)

        def forward(self, x, sublayer):
            return x + self.dropout(sublayer(x))


    class LayerScale(Identity):
        """x + gamma * sublayer(x), gamma (D,) from 0 (a per-feature ReZero gain)."""
        def __init__(self, ctx):
            super().__init__(ctx)
            self.gamma = nn.Parameter(torch.zeros(ctx.cfg.d_model))

        def forward(self, x, sublayer):
            return x + self.gamma * self.dropout(sublayer(x))


    class DropsX(Identity):
        """FAULT: alpha * sublayer(x) -- the residual x is dropped."""
        def __init__(self, ctx):
            super().__init__(ctx)
            self.alpha = nn.Parameter(torch.zeros(()))

        def forward(self, x, sublayer):
            return self.alpha * self.dropout(sublayer(x))


    class TwoGates(Identity):
        """FAULT: x + alpha * beta * sublayer(x), both 0: no gradient ever reaches either."""
        def __init__(self, ctx):
            super().__init__(ctx)
            self.alpha, self.beta = nn.Parameter(torch.zeros(())), nn.Parameter(torch.zeros(()))

        def forward(self, x, sublayer):
            return x + self.alpha * self.beta * self.dropout(sublayer(x))


    class HiddenNorm(Identity):
        """FAULT: x + alpha * sublayer(LayerNorm(x)) with its own nn.LayerNorm (pre-norm in disguise)."""
        def __init__(self, ctx):
            super().__init__(ctx)
            self.alpha = nn.Parameter(torch.zeros(()))
            self.ln = nn.LayerNorm(ctx.cfg.d_model)

        def forward(self, x, sublayer):
            return x + self.alpha * self.dropout(sublayer(self.ln(x)))


    class MakesNorm(DropsX):
        """FAULT: declares no LayerNorm but makes one with ctx.layer_norm()."""
        def __init__(self, ctx):
            super().__init__(ctx)
            self.norm = ctx.layer_norm()

        def forward(self, x, sublayer):
            return x + self.alpha * self.dropout(sublayer(x))


    class FrozenZero(Identity):
        """FAULT: x + 0 * sublayer(x), the gain a constant, not a parameter: the block is the identity."""
        def forward(self, x, sublayer):
            return x + 0.0 * self.dropout(sublayer(x))


    class Squares(Identity):
        """FAULT: x + sublayer(x) ** 2: not a fixed gain times the sub-layer's output."""
        def forward(self, x, sublayer):
            return x + self.dropout(sublayer(x)) ** 2


    class UnusedNorm(DropsX):
        """ReZero as it had to be written before has_layer_norm=False: an unused LayerNorm child."""
        final_norm = False

        def __init__(self, ctx):
            super().__init__(ctx)
            self.norm = ctx.layer_norm()

        def forward(self, x, sublayer):
            return x + self.alpha * self.dropout(sublayer(x))


    NO_LN = {"identity": Identity, "layerscale": LayerScale, "drops_x": DropsX, "two_gates": TwoGates,
             "hidden_norm": HiddenNorm, "makes_norm": MakesNorm, "frozen_zero": FrozenZero, "squares": Squares}


    @hookimpl
    def harness_add_components():
        out = [Component(n, "norm", cls, differs=f"{n}: no LayerNorm (test)", has_layer_norm=False)
               for n, cls in NO_LN.items()]
        return out + [Component("unused_norm", "norm", UnusedNorm, differs="ReZero with an unused LayerNorm")]


    @hookimpl
    def harness_add_variants():
        return [Variant(f"v_{n}", {"norm": n}) for n in [*NO_LN, "unused_norm"]]
''')

#: block -> words the first failure of its component check must contain
FAULTS = {
    "drops_x": "drops the residual x",
    "two_gates": "all-zero gradient at initialisation",
    "hidden_norm": "applied to a transformation of x",
    "makes_norm": "makes a LayerNorm with ctx.layer_norm()",
    "frozen_zero": "never reaches the block's output",
    "squares": "not a fixed gain times sublayer(x)",
}


@pytest.fixture(scope="module")
def blocks(tmp_path_factory):
    path = tmp_path_factory.mktemp("plugin") / "no_ln_blocks.py"
    path.write_text(BLOCKS)
    return load_registry(files=[path])


@pytest.fixture(scope="module")
def rezero():
    return load_registry(files=[REZERO])


# --------------------------------------------------------------------------- ReZero passes everywhere

def test_rezero_passes_check_and_the_kit(rezero, tmp_path):
    code = cli_main(["--plugin", str(REZERO), "check", "--variants", "baseline", "rezero", "-q",
                     "--results-dir", str(tmp_path)])
    assert code == 0
    rows = pd.read_csv(next(tmp_path.glob("checks/*/checks.csv")))
    mine = rows[rows.subject == "norm=rezero"]
    assert list(mine.verdict) == ["conforms", "differs as declared"]
    assert mine.max_abs.iloc[0] < 1e-12 and mine.max_abs.iloc[1] > 0.1  # the contract holds; the size shows
    check_variant_contract(rezero, "rezero")  # the kit: the same checks, through run_checks


def test_rezero_params_count_no_layer_norm(rezero):
    cfg = get_preset("tiny").model
    base = build_model(rezero, rezero.variants["baseline"], cfg)
    model = build_model(rezero, rezero.variants["rezero"], cfg)
    blocks = 5 * cfg.N  # 2 residual blocks per encoder layer, 3 per decoder layer
    assert unique_parameter_count(base) - unique_parameter_count(model) == blocks * 2 * cfg.d_model - blocks
    assert not [n for n, _ in model.named_parameters() if "norm" in n]  # no final LayerNorm either
    alphas = [p.detach() for n, p in model.named_parameters() if n.endswith("alpha")]
    assert len(alphas) == blocks and all(float(a) == 0.0 for a in alphas)  # one alpha per residual, from 0


def test_rezero_runs(rezero, tmp_path):
    code = cli_main(["--plugin", str(REZERO), "run", "--variants", "rezero", "--preset", "tiny", "-q",
                     "--results-dir", str(tmp_path)])
    assert code == 0
    trial = pd.read_csv(next(tmp_path.glob("*/trials.csv"))).iloc[0]
    assert trial.status == "ok"
    assert trial.params == unique_parameter_count(build_model(rezero, rezero.variants["rezero"],
                                                              get_preset("tiny").model))


# --------------------------------------------------------------------------- the residual contract

@pytest.mark.parametrize("name", ["identity", "layerscale"])
def test_correct_blocks_without_layer_norm_conform(blocks, name):
    res = check_contracts(blocks, [("norm", name)], checks.CHECK_MODEL)
    assert [r.verdict for r in res] == ["conforms", "differs as declared"], [r.reason() for r in res]


@pytest.mark.parametrize("name", sorted(FAULTS))
def test_a_block_that_is_not_a_residual_fails_with_the_fault_named(blocks, name):
    res = check_contracts(blocks, [("norm", name)], checks.CHECK_MODEL)
    bad = [r for r in res if not r.ok]
    assert bad and bad[0].verdict == "violates its slot", [r.reason() for r in res]
    assert FAULTS[name] in bad[0].reason(), bad[0].reason()


def test_declared_difference_does_not_excuse_a_dropped_residual(blocks):
    """drops_x declares differs=: the size of a difference is reported, but a block without its residual x
    is no residual block at all. check and the kit fail it alike, and name the fault first."""
    assert blocks.component("norm", "drops_x").differs
    failures = checks.run_checks(blocks, blocks.select(["v_drops_x"])).failures()
    assert "drops the residual x" in failures[0]
    assert contract_failures(blocks, "v_drops_x") == failures
    with pytest.raises(AssertionError, match="drops the residual x"):
        check_variant_contract(blocks, "v_drops_x")


def test_registration_requires_the_norm_slot_and_a_declaration():
    reg = Registry()
    with pytest.raises(PluginError, match="differs="):
        reg.validate_component(Component("nonorm", "norm", lambda ctx: None, has_layer_norm=False))
    with pytest.raises(PluginError, match="norm slot only"):
        reg.validate_component(Component("x", "attention", lambda ctx: None, differs="x", has_layer_norm=False))
    reg.validate_component(Component("ok", "norm", lambda ctx: None, differs="ReZero", has_layer_norm=False))


# --------------------------------------------------------------------------- the kit is check

def test_unused_layer_norm_fails_check_and_the_kit_alike(blocks):
    """The workaround ReZero needed before: an unused LayerNorm child. check used to pass it (its norm
    contract wanted the child) while the kit failed it (no gradient); now both fail it, with one list."""
    failures = checks.run_checks(blocks, blocks.select(["v_unused_norm"])).failures()
    assert len(failures) == 1 and "sublayer.0.norm.weight" in failures[0] and "get no gradient" in failures[0]
    assert contract_failures(blocks, "v_unused_norm") == failures


def test_a_component_violation_fails_the_kit_as_it_fails_check():
    """adv_kv_swapped (keys through w_v) leaks nothing, so the kit's own list of checks used to pass it
    while check failed it; the kit now runs check."""
    reg = load_registry(files=[ROOT / "tests" / "plugins" / "adv_kv_swapped.py"])
    failures = checks.run_checks(reg, reg.select(["adv_kv_swapped"])).failures()
    assert "keys and values swapped" in failures[0]
    assert contract_failures(reg, "adv_kv_swapped") == failures
