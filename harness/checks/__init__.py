"""Equivalence checks and mask probes: which variants compute the same function, and which leak.

Shape letters: B batch, S source length, T target length, D = d_model, H = h heads, V vocabulary.

The recipe (PyTorch's own, ``test/test_transformers.py`` ``check_out_and_grad``):

1. Every variant under check loads **one reference canonical state** (:func:`draw_reference_state`:
   Xavier-uniform matrices, biases U(-1/sqrt(fan_in), +), LayerNorm gains 1 + 0.1 N(0, 1) and
   biases U(-0.1, 0.1), so a swapped or dropped LayerNorm parameter shows). Two variants thus hold
   the same parameters under every canonical name they share -- the same as copying A's
   parameters into B through the canonical layout -- without building N^2 models. What a variant
   cannot hold (a bias in a bias-free projection, three different matrices in one shared
   embedding) is listed as a lossy-load note.
2. Eval mode, one padded batch (:func:`padded_batch`: real source and target padding, S != T, 4 short rows
   and 2 as long as ``max_len`` up to 66),
   cross-entropy against fixed labels at the real (non-pad) target positions; record the logits at
   real target positions and the gradient of every canonical parameter.
3. The same variant again in float64 (the "golden" run). ``ref_error`` = max |run - golden| per
   tensor: how far this variant's own rounding takes it.
4. Across variants A, B: max |A - B| per tensor against ``threshold = max(atol, fudge * max(ref_error_A,
   ref_error_B))`` with ``atol``/``fudge`` from :data:`TOLERANCES`, the one table keyed by
   (dtype, device). |A64 - B64| is reported too: ~1e-15 means the two compute the same function,
   anything larger is a real (declared or not) difference.

Verdicts per pair: ``identical`` (bitwise equal logits and gradients), ``equivalent`` (every tensor
within its threshold), ``differs as declared`` (the variants use components in some slot that are
not declared equivalent, or cannot hold the same parameters, and the size of the difference is
reported), ``differs unexpectedly`` (declared equivalent, measured different: a failure) and
``no difference (declared different)`` (a declared difference that does not show: reported, not a
failure -- the component's own check against its slot already says whether it changes anything).
What is declared comes from the components' registrations (:func:`harness.checks.contracts.declared_groups`:
components that declare nothing are held to their slot's reference and so to each other;
``equivalent_to=`` and ``differs=`` say otherwise); ``--equivalent SLOT=A,B`` (``groups=``) overrides.

Every component the selected variants use is first held to its slot's reference on its own
(:mod:`harness.checks.contracts`); ``all_components=True`` (``check --all-components``) checks every
registered component instead.

Against PyTorch: every attention component vs ``torch.nn.MultiheadAttention`` with mapped weights
(packed ``in_proj_weight`` = [w_q; w_k; w_v], its bool masks meaning True = blocked), and whole
encoder-decoder stacks vs ``torch.nn.Transformer(norm_first=False/True)`` given the same embedded
inputs (the embeddings and generator live outside ``nn.Transformer``).

Mask probes need no reference: changing the tokens at padded source positions (masks kept) or the
target tokens after position t must leave the logits at real positions (up to t) unchanged, in eval
and in train mode. Train mode uses dropout > 0 with the RNG re-seeded before each forward, so both
forwards drop exactly the same units (same shapes, same draw order) and only the perturbed tokens
differ; this exercises the mask together with attention dropout, which dropout 0 in train mode would
not.

Sources: Vaswani et al. 2017 §3.2; PyTorch ``test_transformers.py`` (golden float64 reference,
fudge factor 5) and ``torch.testing`` default tolerances; study notes 001 and 002 for the bugs.

The package, one module per seam (each imports only the ones above it):

* :mod:`~harness.checks.inputs` -- the check config, the padded batch, the reference state's draw, shared helpers
* :mod:`~harness.checks.contracts` (with ``contract_base``, ``contract_attention``, ``contract_layers``) --
  every component against its slot's reference; :mod:`~harness.checks.contract_variant` -- a variant's model
  contract (logits, gradients, canonical round trip, same seed); :mod:`~harness.checks.probes` -- the model-level probes
* :mod:`~harness.checks.policy` -- every tolerance and the longest row the checks feed;
  :mod:`~harness.checks.expectations` -- what each pair is expected to show (declared groups)
* :mod:`~harness.checks.runs` -- running variants and :class:`CheckSession`, the set-up made once
* :mod:`~harness.checks.pairs` -- comparing tensors, pairs and verdicts
* :mod:`~harness.checks.masks`, :mod:`~harness.checks.mha`, :mod:`~harness.checks.transformer`,
  :mod:`~harness.checks.ties` -- the report's sections (mask components, PyTorch references, tied embeddings)
* :mod:`~harness.checks.report` -- :class:`CheckStage` (one kind of check) and :class:`CheckReport`;
  :mod:`~harness.checks.sections` -- what each stage runs and which of its results fail;
  :mod:`~harness.checks.render` -- each stage's ``checks.csv`` rows and ``checks.md`` section, the terminal text;
  :mod:`~harness.checks.stages` -- :data:`STAGES`, the registered kinds (a new kind is one entry there)
* :mod:`~harness.checks.whole` -- the whole check (:func:`run_checks`: every stage, in order)
"""
from __future__ import annotations

from .inputs import CHECK_MODEL, describe_exception, draw_reference_state, padded_batch
from .masks import MaskComponentResult, mask_result, probe_mask_component
from .mha import compare_attention_with_mha
from .pairs import (CRASHES, DECLARED, EQUIVALENT, IDENTICAL, NOT_COMPARABLE, UNEXPECTED, UNEXPECTED_SAME, PairResult,
                    ReferenceResult, TensorDiff, compare_outputs, compare_variants, layout_relation, tensor_diff)
from .expectations import (expected_relation, held_to_reference, merge_groups, parse_equivalent, registry_groups,
                           same_function, slot_default)
from .policy import TOLERANCES, Tolerance, get_tolerance
from .properties.causal import probe_causal
from .properties.measure import ProbeResult
from .properties.outputs import probe_finite
from .properties.padding import probe_extra_padding, probe_masked_keys
from .render import LEGEND, class_summary, matrix_frame, render_markdown, render_text, results_frame
from .runs import (CheckSession, VariantRun, canonical_grads, forward_backward, load_variant, reference_state,
                   run_variant, tf32_disabled)
from .report import BugResult, CheckContext, CheckReport, CheckStage, stage_registry
from .stages import STAGES
from .whole import bug_reasons, probe_variant, run_checks
from .ties import TieResult, check_ties, tie_groups
from .transformer import compare_with_nn_transformer, make_nn_transformer, nn_transformer_name, nn_transformer_structure

__all__ = [
    "BugResult", "CHECK_MODEL", "CRASHES", "CheckContext", "CheckReport", "CheckSession", "CheckStage", "DECLARED",
    "EQUIVALENT", "IDENTICAL", "LEGEND", "MaskComponentResult", "NOT_COMPARABLE", "PairResult", "ProbeResult",
    "ReferenceResult", "STAGES", "TOLERANCES", "TensorDiff", "TieResult", "Tolerance", "UNEXPECTED",
    "UNEXPECTED_SAME", "VariantRun", "bug_reasons", "canonical_grads", "check_ties", "class_summary",
    "compare_attention_with_mha", "compare_outputs", "compare_variants", "compare_with_nn_transformer",
    "describe_exception", "draw_reference_state", "expected_relation", "forward_backward", "get_tolerance",
    "held_to_reference", "layout_relation", "load_variant", "make_nn_transformer", "mask_result", "matrix_frame",
    "merge_groups", "nn_transformer_name", "nn_transformer_structure", "padded_batch", "parse_equivalent",
    "probe_causal", "probe_extra_padding", "probe_finite", "probe_mask_component", "probe_masked_keys",
    "probe_variant", "reference_state", "registry_groups", "render_markdown", "render_text", "results_frame",
    "run_checks", "run_variant", "same_function", "slot_default", "stage_registry", "tensor_diff", "tf32_disabled",
    "tie_groups"
]
