"""Compatibility path: the component contracts live in :mod:`harness.checks.contracts`."""
from __future__ import annotations

from .checks.contracts import (ATOL, ATTENTION_FAULTS, ATTENTION_LAYOUT, CONFORMS, CRASHES, DECLARED,  # noqa: F401
                               FLAGGED, NO_DIFF, NOT_FLAGGED, RTOL, SLOT_CHECKS, SLOT_REFERENCES, VIOLATES,
                               ComponentResult, OutsideCanonicalLayout, ReferenceMask, check_attention,
                               check_component, check_components, check_embedding, check_layer_norm, check_mask,
                               check_norm, check_positional, check_projections, declared_groups, diagnose_mask,
                               reference_attention, reference_components, reference_key, sinusoidal_pe,
                               uncovered_parameters)
