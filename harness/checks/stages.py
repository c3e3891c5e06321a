"""The check's kinds, registered once: :data:`STAGES`, in the order they run, fail and render.

A new kind of check is one more :class:`~harness.checks.report.CheckStage` here (its run
function, its failures, its ``checks.csv`` rows and its ``checks.md`` section); nothing else
changes (docs/architecture.md, "Add a check").
"""
from __future__ import annotations

from . import render as r
from . import sections as s
from .report import CheckContext, CheckStage, stage_registry


def _variants_line(ctx: CheckContext) -> str:
    return (f"check: {len(ctx.clean)} variant(s) + {len(ctx.buggy)} faithful-bug variant(s) on "
            f"{ctx.session.device.type} {ctx.dtype}")


#: Every kind of check, in the order it runs (a stage may read the results of the ones before it in
#: ``ctx.results``), and in which its failures, ``checks.csv`` rows and ``checks.md`` section come.
STAGES: tuple[CheckStage, ...] = stage_registry(
    CheckStage("components", s.run_components, s.component_failures, r.component_rows, r.md_components,
               log=lambda ctx: f"check: {len(ctx.keys)} component(s) against their slot's reference"),
    CheckStage("runs", s.run_variants, s.crash_failures, log=_variants_line),
    CheckStage("pairs", s.run_pairs, s.pair_failures, r.pair_rows, r.md_variants),
    CheckStage("probes", s.run_model_probes, s.probe_failures, r.probe_rows, r.md_probes,
               log=lambda ctx: f"check: {len(ctx.results['pairs'])} pair(s) compared; probes"),
    CheckStage("masks", s.run_masks, rows=r.mask_rows, markdown=r.md_masks),
    CheckStage("mha", s.run_mha, s.reference_failures("mha"), r.reference_rows("mha", "nn.MultiheadAttention"),
               r.md_mha, log=lambda ctx: "check: attention vs nn.MultiheadAttention, stacks vs nn.Transformer"),
    CheckStage("transformer", s.run_transformer, s.reference_failures("transformer"),
               r.reference_rows("transformer", "nn.Transformer"), r.md_transformer),
    CheckStage("ties", s.run_ties, s.tie_failures, r.tie_rows, r.md_ties,
               log=lambda ctx: "check: tied embeddings, devices"),
    CheckStage("devices", s.run_devices, s.reference_failures("devices"), r.reference_rows("devices", "device"),
               r.md_devices),
    CheckStage("bugs", s.run_bugs, s.bug_failures, r.bug_rows, r.md_bugs),
)
