"""Conformance kit: run the harness's checks on your own components from your own test suite.

Everything here is a thin, assertion-raising wrapper around :mod:`harness.checks` -- the same
code ``python -m harness check`` runs -- so a plugin's tests and the CLI cannot disagree. The
project's own tests use this kit (``tests/test_checks.py``).

Example (a plugin's ``tests/test_my_plugin.py``)::

    from harness.testing import (assert_equivalent, assert_matches_multihead_attention,
                                 check_variant_contract, load_registry)

    REG = load_registry(files=["my_plugin.py"])          # or modules=["harness_my"]

    def test_contract():
        check_variant_contract(REG, "my_variant")           # everything `check --variants my_variant`
                                                             # runs: components, gradients, canonical
                                                             # layout, probes, PyTorch references, ties
    def test_my_attention_is_multi_head_attention():
        assert_matches_multihead_attention(REG, "my_attn")  # vs torch.nn.MultiheadAttention

    def test_same_function_as_baseline():
        assert_equivalent(REG, "my_variant", "baseline")

pytest fixtures (``pytest_plugins = ["harness.testing"]`` in a conftest, or import them):
``harness_registry`` (built-ins plus installed plugins) and ``harness_config`` (the check config:
N=2, d_model=32, h=4, d_ff=64, dropout 0.1).

Every ``assert_*`` raises ``AssertionError`` whose message says what was compared, the size of the
difference, the threshold and why (e.g. "decoder position 0 changed ... causal mask not applied").
"""
from __future__ import annotations

import dataclasses
from typing import Iterable

from .checks import (CHECK_MODEL, DECLARED, EQUIVALENT, IDENTICAL, NOT_COMPARABLE, BugResult, MaskComponentResult,
                     PairResult, ProbeResult, ReferenceResult, TieResult, bug_reasons, check_ties,
                     compare_attention_with_mha, compare_variants, compare_with_nn_transformer, get_tolerance,
                     padded_batch, probe_mask_component, probe_variant, reference_state, registry_groups, run_checks)
from .checks.contracts import check_contracts as _contract_results
from .checks.contracts import reference_key
from .config import ModelConfig
from .plugins import PluginSpec
from .registry import Registry, Variant

__all__ = [
    "load_registry", "small_config", "padded_batch", "check_components", "check_variant_contract", "contract_failures",
    "assert_equivalent", "assert_differs", "assert_mask_probes_pass", "assert_mask_component",
    "assert_matches_multihead_attention", "assert_matches_nn_transformer", "assert_ties_hold", "assert_flagged",
    "harness_registry", "harness_config",
]


def load_registry(files: Iterable[str] = (), modules: Iterable[str] = (), strict: bool = True) -> Registry:
    """A registry with the built-ins, installed plugins (unless ``HARNESS_DISABLE_PLUGIN_AUTOLOAD``
    is set) and the given plugin files / modules. ``strict`` (default here) turns a broken plugin
    into an error instead of a warning.

    Raises:
        PluginError, DuplicateNameError, UnknownNameError: as :meth:`Registry.from_plugins`.
    """
    return Registry.from_plugins(PluginSpec(modules=list(modules), files=[str(f) for f in files], strict=strict))


def small_config(**overrides) -> ModelConfig:
    """The check config (:data:`harness.checks.CHECK_MODEL`) with ``overrides``, validated.

    Example: ``small_config(d_model=64, h=8)``. Raises ConfigError on a bad value.
    """
    return ModelConfig.from_dict({**dataclasses.asdict(CHECK_MODEL), **overrides})


def _variant(registry: Registry, name: str | Variant) -> Variant:
    return name if isinstance(name, Variant) else registry.select([name])[0]


def _as_reference(registry: Registry, slot: str, name: str) -> dict[str, list[set[str]]]:
    """An ``--equivalent`` group putting ``name`` with a component held to the slot's reference."""
    refs = [n for (s, n) in sorted(registry.components) if s == slot and n != name
            and reference_key(registry, s, n) == "reference"]
    return {slot: [{name, refs[0]}]} if refs else {}


def _fail(title: str, lines: list[str]) -> None:
    if lines:
        raise AssertionError(title + "\n" + "\n".join(f"  - {x}" for x in lines))


# --------------------------------------------------------------------------- contract

def check_components(registry: Registry, variant: str | Variant, cfg: ModelConfig | None = None, *,
                     seed: int = 0) -> list:
    """Assert that every component ``variant`` uses meets its slot's contract
    (:mod:`harness.checks.contracts`: the slot's reference, or what the component declares).

    Returns the :class:`harness.checks.contract_base.ComponentResult` list (declared differences carry their
    size). Raises AssertionError naming each violation and its diagnosis.
    """
    cfg = (cfg or CHECK_MODEL).validate()
    v = _variant(registry, variant)
    res = _contract_results(registry, sorted(v.resolved().items()), cfg, seed)
    _fail(f"variant {v.name!r}: components that break their slot's contract:",
          [r.reason() for r in res if not r.ok and not r.buggy])
    return res


def contract_failures(registry: Registry, variant: str | Variant, cfg: ModelConfig | None = None, *,
                      seed: int = 0, device: str = "cpu") -> list[str]:
    """Everything ``variant`` breaks of the harness contract (empty list: conforms): exactly the
    failures ``python -m harness check --variants NAME --seed SEED`` reports for it, computed by the
    same function (:func:`harness.checks.run_checks`). A faithful-bug variant is held like any other
    here (:func:`assert_flagged` asks the opposite question). See :func:`check_variant_contract`."""
    v = dataclasses.replace(_variant(registry, variant), buggy=False)
    return run_checks(registry, [v], cfg, device=device, seed=seed).failures()


def check_variant_contract(registry: Registry, variant: str | Variant, cfg: ModelConfig | None = None, *,
                           seed: int = 0, device: str = "cpu") -> None:
    """Assert that ``variant`` passes every check ``python -m harness check --variants NAME`` runs on it
    (one code path: :func:`harness.checks.run_checks`), so the kit and ``check`` cannot disagree.

    Checked: every component it uses against its slot's contract (or what the component declares);
    logits of shape (B, T, V), finite; holding the check's random reference state, a finite, non-zero
    gradient on every parameter (a parameter with none is unused); the canonical state round-trips
    exactly into a fresh model; the same seed builds the same model; the probes (finite gradients, causal
    leak and masked source keys in eval and train mode, extra source padding); its attention against
    ``nn.MultiheadAttention`` and its stacks against ``nn.Transformer`` where comparable; tied parameters
    survive ``.to`` and ``load_state_dict``; CPU vs CUDA when CUDA is present.

    Raises:
        AssertionError: listing every broken item.
    """
    name = variant if isinstance(variant, str) else variant.name
    _fail(f"variant {name!r} breaks the harness contract:",
          contract_failures(registry, variant, cfg, seed=seed, device=device))


# --------------------------------------------------------------------------- equivalence

def assert_equivalent(registry: Registry, a: str | Variant, b: str | Variant, cfg: ModelConfig | None = None, *,
                      device: str = "cpu", dtype: str = "fp32", seed: int = 0) -> PairResult:
    """Assert that B, holding A's canonical parameters, computes A's logits (real target positions)
    and gradients within ``max(atol, fudge * ref_error)`` (:data:`harness.checks.TOLERANCES`).

    Returns the :class:`~harness.checks.PairResult` (verdict ``identical`` or ``equivalent``).
    Raises AssertionError with the sizes and thresholds otherwise.
    """
    res = compare_variants(registry, a, b, cfg, device=device, dtype=dtype, seed=seed, expected="equivalent")
    if res.verdict not in (IDENTICAL, EQUIVALENT):
        raise AssertionError(res.explain())
    return res


def assert_differs(registry: Registry, a: str | Variant, b: str | Variant, cfg: ModelConfig | None = None, *,
                   device: str = "cpu", dtype: str = "fp32", seed: int = 0) -> PairResult:
    """Assert that A and B compute measurably different functions (beyond the threshold) without
    crashing; the result carries the size (``res.logits.max_abs``, ``res.grad_max``)."""
    res = compare_variants(registry, a, b, cfg, device=device, dtype=dtype, seed=seed, expected="differs")
    if res.verdict != DECLARED:
        raise AssertionError(res.explain())
    return res


# --------------------------------------------------------------------------- masks

def assert_mask_probes_pass(registry: Registry, variant: str | Variant, cfg: ModelConfig | None = None, *,
                            device: str = "cpu", dtype: str = "fp32", seed: int = 0) -> list[ProbeResult]:
    """Assert no causal leak and no padded-key leak, in eval and train mode (see :mod:`harness.checks`)."""
    v = _variant(registry, variant)
    res = probe_variant(registry, v, cfg, device=device, dtype=dtype, seed=seed)
    _fail(f"variant {v.name!r} fails mask probes:", [p.detail for p in res if not p.passed])
    return res


def assert_mask_component(registry: Registry, mask: str, cfg: ModelConfig | None = None, *,
                          fully_masked_row: str | None = None, seed: int = 0) -> MaskComponentResult:
    """Assert that mask component ``mask`` blocks padded and future keys exactly like the reference
    masked softmax; optionally that a fully masked row gives ``fully_masked_row`` (``"uniform"``,
    ``"nan"``, ``"zeros"`` or ``"finite"``: :data:`harness.registry.FULLY_MASKED_ROW`)."""
    cfg = (cfg or CHECK_MODEL).validate()
    res = probe_mask_component(registry, mask, cfg, padded_batch(cfg, seed=seed), seed)
    problems = [] if res.passed else [res.detail]
    if fully_masked_row is not None and res.fully_masked_row != fully_masked_row.lower():
        problems.append(f"fully masked row gives {res.fully_masked_row}, expected {fully_masked_row}")
    _fail(f"mask component {mask!r}:", problems)
    return res


# --------------------------------------------------------------------------- PyTorch references

def assert_matches_multihead_attention(registry: Registry, attention: str, mask: str | None = None,
                                       projections: str | None = None, cfg: ModelConfig | None = None, *,
                                       device: str = "cpu", dtype: str = "fp32", seed: int = 0) -> list[ReferenceResult]:
    """Assert attention component ``attention`` (with ``mask`` and ``projections`` components, default:
    their slots' defaults) equals ``torch.nn.MultiheadAttention`` with mapped weights, in self- and
    cross-attention: output at real query rows, gradients of w_q, w_k, w_v, w_o and of both inputs."""
    res = compare_attention_with_mha(registry, attention, mask, projections, cfg, device=device, dtype=dtype,
                                     seed=seed, expected="equivalent")
    _fail(f"attention={attention} does not match nn.MultiheadAttention:",
          [r.explain() for r in res if r.verdict not in (IDENTICAL, EQUIVALENT)])
    return res


def assert_matches_nn_transformer(registry: Registry, variant: str | Variant, cfg: ModelConfig | None = None, *,
                                  device: str = "cpu", dtype: str = "fp32", seed: int = 0) -> list[ReferenceResult]:
    """Assert ``variant``'s encoder-decoder stack equals ``torch.nn.Transformer`` wherever the structures
    match (post-norm against nn.Transformer with norm=None, since the stock module always adds final
    LayerNorms). Raises AssertionError when nothing is comparable (with the reasons) or a comparison fails."""
    cfg = (cfg or CHECK_MODEL).validate()
    v = _variant(registry, variant)
    r = v.resolved()
    groups = registry_groups(registry, {**_as_reference(registry, "attention", r["attention"]),
                                        **_as_reference(registry, "mask", r["mask"])})
    state, _ = reference_state(registry, [v], cfg, seed)
    res = compare_with_nn_transformer(registry, v, cfg, state, device=device, dtype=dtype, seed=seed, groups=groups)
    compared = [x for x in res if x.verdict != NOT_COMPARABLE]
    if not compared:
        raise AssertionError(f"{v.name} cannot be compared with nn.Transformer: " + "; ".join(x.detail for x in res))
    _fail(f"{v.name} does not match nn.Transformer:",
          [x.explain() for x in compared if x.verdict not in (IDENTICAL, EQUIVALENT)])
    return res


# --------------------------------------------------------------------------- ties and bugs

def assert_ties_hold(registry: Registry, variant: str | Variant, cfg: ModelConfig | None = None, *,
                     device: str = "cpu", seed: int = 0, expect_tied: bool | None = None) -> TieResult:
    """Assert tied parameters stay tied after ``.to`` and ``load_state_dict`` (and, for a tied
    embedding, that the untied counterpart holding the tied matrix computes the same logits and the
    tied gradient is the sum of the untied ones). ``expect_tied`` additionally requires ties (True)
    or none (False)."""
    cfg = (cfg or CHECK_MODEL).validate()
    v = _variant(registry, variant)
    state, _ = reference_state(registry, [v], cfg, seed)
    res = check_ties(registry, v, cfg, state, device=device, tol=get_tolerance("fp32", device), seed=seed)
    problems = [] if res.passed else [res.detail]
    if expect_tied is not None and bool(res.groups) != expect_tied:
        problems.append(f"expected {'tied' if expect_tied else 'no tied'} parameters, found {res.groups or 'none'}")
    _fail(f"variant {v.name!r}:", problems)
    return res


def assert_flagged(registry: Registry, variant: str | Variant, cfg: ModelConfig | None = None, *,
                   device: str = "cpu", dtype: str = "fp32", seed: int = 0) -> BugResult:
    """Assert the checks flag ``variant`` (a crash, a leaking probe, a broken mask component or a
    mismatch with nn.MultiheadAttention / nn.Transformer). For plugins that reproduce a bug on
    purpose. Returns the :class:`~harness.checks.BugResult` with the reasons."""
    v = _variant(registry, variant)
    res = bug_reasons(registry, v, cfg, device=device, dtype=dtype, seed=seed)
    if not res.flagged:
        raise AssertionError(f"no check flags {v.name!r}: it crashes nowhere, leaks in no probe and matches "
                             f"nn.MultiheadAttention / nn.Transformer")
    return res


# --------------------------------------------------------------------------- pytest fixtures

try:
    import pytest
except ImportError:  # pragma: no cover - the kit's functions work without pytest
    pytest = None

if pytest is not None:
    @pytest.fixture
    def harness_registry() -> Registry:
        """A fresh registry: built-ins and installed plugins (a new plugin manager per test)."""
        return Registry.from_plugins()

    @pytest.fixture
    def harness_config() -> ModelConfig:
        """The check config (N=2, d_model=32, h=4, d_ff=64, dropout 0.1, vocab 11, max_len 32)."""
        return CHECK_MODEL
