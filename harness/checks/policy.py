"""Check policy: every tolerance the checker holds a gap to, and the longest row it feeds.

Tolerances between variants: ``threshold = max(atol, fudge * ref_error)`` (PyTorch ``test_transformers``'
``check_out_and_grad``), keyed by (dtype, device type) in :data:`TOLERANCES`. The other thresholds, each by
name below: a component against its slot's reference (:data:`COMPONENT_ATOL`, :data:`COMPONENT_RTOL`), the run
gate (:data:`GATE_ATOL`, :data:`GATE_RTOL`, :data:`PRECISION_LOGIT_FACTOR`), and the narrower tests of the
component contracts (mask probabilities, dropout bias, ALiBi slopes, fault matching). No other module of
:mod:`harness.checks` writes a tolerance literal or a ``LONGEST_*`` constant (``tests/test_policy.py`` holds it).

A leaf: it imports nothing of :mod:`harness.checks` (and of the harness only its errors), so every checker
module, :mod:`harness.checks.inputs` and the component contracts included, imports it without a cycle. What each
pair of variants is expected to show is in :mod:`harness.checks.expectations`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ConfigError

# --------------------------------------------------------------------------- the longest row

#: The longest row the checks feed: the check batch's long rows (:func:`harness.checks.inputs.padded_batch`),
#: the per-position contracts (attention, feed-forward, layer norm, residual: ``contract_base.rows_length``), the
#: positional encoding's embeddings and its rotated scores (``contract_positions``) all run at
#: ``min(cfg.max_len, LONGEST_ROW)``. 66 is the longest row any preset builds (``model.max_len`` is 64 by default
#: and at most 66 at every preset in :data:`harness.config.PRESETS`: text_cpu 66, its context of 64 characters plus
#: the two positions every run keeps; g2p 24, tiny 16), so at every preset each check sees the whole row the run
#: trains on (a table indexed ``pos % 16`` or a layer that mixes positions after 16 shows). Beyond it a row's cost
#: grows quadratically (the (L, L) scores of every attention, in float64, for every variant and component checked)
#: while the faults the checks look for (position-dependent ones from 16 on) already show; a ``--set
#: model.max_len`` above 66 is checked on its first 66 positions.
LONGEST_ROW = 66

# --------------------------------------------------------------------------- absolute + relative bounds

#: A component against its slot's reference (float64 on both sides, outputs in the compared output's unit):
#: ``|component - reference| <= COMPONENT_ATOL + COMPONENT_RTOL * max |reference|`` (float32 rounding inside a
#: component, such as a float32 table, stays within it; :mod:`harness.checks.contracts`).
COMPONENT_ATOL, COMPONENT_RTOL = 1e-5, 1e-4
#: The run gate (:mod:`harness.checks.properties`, :mod:`harness.checks.gate`), float32 logits:
#: ``|a - b| <= GATE_ATOL + GATE_RTOL * max |logit|`` of the probe batch. ``harness.tasks.base.LEAK_ATOL`` and
#: ``LEAK_RTOL`` (the held-out leak test; the tasks layer cannot import this one) hold the same pair
#: (``tests/test_policy.py``).
GATE_ATOL, GATE_RTOL = 1e-5, 1e-4
#: The run gate's bf16 item: the logits' autocast-vs-float32 gap must stay within this many times the gap that
#: rounding the float32 weights to bf16 makes (plus :data:`GATE_ATOL`). Measured on the CPU over the 33 built-in
#: variants of ``all``, ``group:modern`` and ``group:questions`` at the tiny, quick and g2p presets' model configs:
#: at most 2.7x; an attention that divides by d_model under autocast only: 94-96x (tests/plugins/adv_scale_in_bf16.py).
#: The gradients have no such limit: the same yardstick put honest built-ins at up to 12x (tiny preset) and
#: BatchNorm's far beyond, so only a gradient that vanishes under autocast is caught
#: (tests/plugins/adv_keys_detached_in_bf16.py, :data:`GRADIENT_PRESENT`). Not yet measured on CUDA.
PRECISION_LOGIT_FACTOR = 10.0
#: A parameter "has a gradient" in float32 when its largest |gradient| exceeds this fraction of the largest over
#: all parameters (the bf16 gate item asks such a parameter to have one under autocast too).
GRADIENT_PRESENT = 1e-3

# --------------------------------------------------------------------------- the component contracts' own tests

#: Attention probabilities (float64): a blocked key's weight above this counts as attended, and a row this close
#: to uniform counts as uniform (the mask contract, ``contract_mask``); also the threshold its results report.
MASK_PROB_ATOL = 1e-6
#: The largest relative bias of the mean training output that passes the dropout contract
#: (``contract_dropout``). Measured over the 12 built-in attention and feed-forward components at the check config
#: and the tiny, quick, paper, g2p and gpu presets' model configs: at most 0.025 (sampling noise at 128 draws;
#: GEGLU at d_model 16); a mask without the rescale: 0.49 (tests/plugins/adv_dropout_no_rescale.py).
DROPOUT_MAX_BIAS = 0.1
#: A score bias (float64) is ALiBi's ``-m_h * |i - j|`` when it matches within this pair (``formulas``).
ALIBI_ATOL, ALIBI_RTOL = 1e-6, 1e-4
#: ALiBi's slopes are "all equal" or "geometric" when they (or their ratios) agree to this relative tolerance,
#: and equal to 1/H within :data:`ALIBI_SLOPE_ATOL` (``formulas.alibi_slope_fault``).
ALIBI_SLOPE_RTOL = 1e-6
ALIBI_SLOPE_ATOL = 1e-9
#: A layer norm's known fault names its output when the output is within ``max(threshold, FAULT_MATCH_RTOL *
#: max |fault's output|)`` of it (``contract_layers``): the faults are float64 formulas, the component may
#: round in float32.
FAULT_MATCH_RTOL = 1e-3
#: The ``architecture`` contract (``contract_architecture``): the largest |Δ logit| in float64 between two ways of
#: computing the same logits (the whole target vs a prefix, ``forward`` vs ``decode``): rounding is ~1e-15 there.
ARCHITECTURE_ATOL = 1e-9
#: A residual block whose least-squares gain on its sub-layer is at most this (in |a|) is the identity
#: (``contract_layers``): float64 zero, not a small gain.
ZERO_GAIN = 1e-12


@dataclass(frozen=True)
class Tolerance:
    """How close two runs must be to count as the same function.

    Args:
        atol: absolute floor of the threshold (same unit as the compared tensor).
        fudge: multiplier on the reference error (error of a run against its own float64 run).
        note: where the numbers come from / the policy they assume.
    """

    atol: float
    fudge: float
    note: str = ""

    ref_cap: float = math.inf

    def threshold(self, ref_error: float, scale: float | None = None) -> float:
        """``max(atol, fudge * ref_error)`` (PyTorch ``check_out_and_grad``); ``atol`` if ``ref_error`` is
        not finite. With ``scale`` (max |float64 value| of the compared tensor) ``ref_error`` is first
        capped at ``max(ref_cap * scale, 100 * atol)``: a run whose error against its own float64 run is far beyond
        rounding (a component that is right only in float64) must not widen its own threshold by it."""
        if not math.isfinite(ref_error):
            return self.atol
        if scale is not None and math.isfinite(scale):
            ref_error = min(ref_error, max(self.ref_cap * scale, 100 * self.atol))
        return max(self.atol, self.fudge * ref_error)


#: The one tolerance table, keyed by (dtype, device type). fp32 on CUDA assumes TF32 is off (the
#: checks switch it off and record the policy); bf16 means ``torch.autocast(bfloat16)``.
TOLERANCES: dict[tuple[str, str], Tolerance] = {
    ("fp32", "cpu"): Tolerance(1e-5, 5.0, "torch.testing default atol for float32; fudge 5 as in PyTorch "
                              "test_transformers; reference error capped at 1e-3 x max|value|", 1e-3),
    ("fp32", "cuda"): Tolerance(1e-5, 5.0, "as fp32/cpu; TF32 switched off for matmul and cuDNN during the checks",
                                1e-3),
    ("bf16", "cpu"): Tolerance(1e-3, 5.0, "torch.autocast(bfloat16); PyTorch default_atol[bfloat16]; reference "
                              "error capped at 0.1 x max|value|", 0.1),
    ("bf16", "cuda"): Tolerance(1e-3, 5.0, "torch.autocast(bfloat16); PyTorch default_atol[bfloat16]", 0.1),
}


def get_tolerance(dtype: str, device: str) -> Tolerance:
    """The :data:`TOLERANCES` entry for ``dtype`` (fp32, bf16) on ``device`` (cpu, cuda, cuda:N).

    Raises:
        ConfigError: no entry for that pair.
    """
    key = (dtype, device.split(":")[0])
    if key not in TOLERANCES:
        known = ", ".join(f"{d}/{dev}" for d, dev in TOLERANCES)
        raise ConfigError(f"no check tolerance for dtype {dtype!r} on {device!r}; known: {known}")
    return TOLERANCES[key]
