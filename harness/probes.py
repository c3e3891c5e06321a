"""Compatibility path: the model-level probes live in :mod:`harness.checks.probes`."""
from __future__ import annotations

from .checks.probes import (GATE_ATOL, GATE_RTOL, ProbeResult, gate_batch, integrity_reasons,  # noqa: F401
                            probe_causal, probe_extra_padding, probe_finite, probe_masked_keys, run_probes)
