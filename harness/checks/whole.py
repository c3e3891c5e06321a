"""The whole check: every registered stage (:data:`harness.checks.stages.STAGES`) on a set of
variants (:func:`run_checks`), and the single-variant entry points (:func:`probe_variant`,
:func:`bug_reasons`).

Every stage works on one :class:`~harness.checks.runs.CheckSession`, made once per call.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable

import torch

from ..config import ModelConfig
from ..registry import Registry, Variant
from .inputs import CHECK_MODEL
from .properties.measure import ProbeResult
from .properties.rows import preset_task_rows
from .report import BugResult, CheckContext, CheckReport, CheckStage, classes_of
from .runs import CheckSession
from .sections import pairs_of, probe_model
from .stages import STAGES


def equivalence_classes(registry: Registry, variants: list[Variant], cfg: ModelConfig | None = None, *,
                        device: torch.device | str = "cpu", dtype: str = "fp32", seed: int = 0,
                        task_rows="default") -> list[list[str]]:
    """Only the pair comparisons of :func:`run_checks` (same session, tolerances and verdicts), so
    the same classes as ``run_checks(...).classes()`` without the contracts, probes and PyTorch
    references: what ``run`` records before training (its run gate holds each trial to the
    contracts and probes anyway). Buggy variants are left out. ``task_rows``: as :func:`run_checks`'s.

    Raises:
        ConfigError: bad config/dtype/device.  HarnessError: inconsistent canonical layouts.
    """
    s = CheckSession.create(registry, cfg, device=device, dtype=dtype, seed=seed,
                            task_rows=_rows(registry, task_rows, cfg, seed))
    clean = [v for v in variants if not v.buggy]
    with s.tf32_off():
        s.load_state(clean)
        for v in clean:
            s.run(v)
        pairs = pairs_of(s, clean)
    return classes_of([v.name for v in clean], pairs)


def run_checks(registry: Registry, variants: list[Variant], cfg: ModelConfig | None = None, *,
               device: torch.device | str = "cpu", dtype: str = "fp32", seed: int = 0, groups=None,
               log: Callable[[str], None] | None = None, all_components: bool = False,
               stages: tuple[CheckStage, ...] = STAGES, task_rows="default") -> CheckReport:
    """Run every check on ``variants`` (buggy ones are probed and must be flagged, never paired).

    Scope: the components the variants use (each held to its slot's reference on its own, and every
    attention x mask in use against ``nn.MultiheadAttention``); with ``all_components`` every
    registered component. Nothing outside the scope can change the result. Each variant's probes
    come with its model-level contract (:func:`~harness.checks.contract_variant.variant_contract`:
    logits, gradients, canonical round trip, same seed), in the ``probes`` stage. The conformance
    kit (:mod:`harness.testing`) calls this function: the kit and ``check`` cannot disagree.

    Args:
        cfg: model config (default :data:`~harness.checks.inputs.CHECK_MODEL`).
        device: where the comparisons run; the CPU-vs-CUDA comparison runs whenever CUDA exists.
        dtype: ``fp32`` or ``bf16`` (autocast).
        groups: declared-equivalent components (default: the registrations' declarations,
            :func:`~harness.checks.expectations.registry_groups`).
        log: optional progress callback (one line per stage).
        stages: the kinds of check to run, in order (default: every registered one,
            :data:`harness.checks.stages.STAGES`).
        task_rows: rows a task drew (:func:`harness.checks.properties.rows.task_rows`) for the model probes, beside the
            drawn batch: ``"default"`` draws the default preset's task's (``check --preset`` passes its preset's);
            None: the drawn batch only.

    Returns:
        CheckReport: each stage's results under its name (``report.pairs``, ``report.bugs``, ...).

    Raises:
        ConfigError: bad config/dtype/device.  HarnessError: inconsistent canonical layouts.
    """
    t0 = time.perf_counter()
    log = log or (lambda line: None)
    s = CheckSession.create(registry, cfg, device=device, dtype=dtype, seed=seed, groups=groups,
                            task_rows=_rows(registry, task_rows, cfg, seed))
    s.declared()
    keys = sorted(registry.components) if all_components else _used_components(variants)
    ctx = CheckContext(s, registry, variants, [v for v in variants if not v.buggy], [v for v in variants if v.buggy],
                       keys, seed, dtype)
    with s.tf32_off():
        for stage in stages:
            if stage.log:
                log(stage.log(ctx))
            ctx.results[stage.name] = stage.run(ctx)
    return CheckReport(variants=[v.name for v in ctx.clean], buggy=[v.name for v in ctx.buggy], cfg=s.cfg,
                       device=s.device.type, dtype=dtype, seed=seed, tolerance=s.tol, tf32=s.tf32,
                       wall_s=time.perf_counter() - t0, results=ctx.results, stages=tuple(stages))


def _rows(registry: Registry, task_rows, cfg: ModelConfig | None, seed: int):
    """``task_rows`` as given, or for ``"default"`` the default preset's task's rows at ``cfg``."""
    return preset_task_rows(registry, None, (cfg or CHECK_MODEL).validate(), seed) if isinstance(task_rows, str) \
        else task_rows


def _used_components(variants) -> list[tuple[str, str]]:
    """Every (slot, component) the variants use, sorted."""
    return sorted({(slot, name) for v in variants for slot, name in v.resolved().items()})


def probe_variant(registry: Registry, variant: Variant, cfg: ModelConfig | None = None, *,
                  device: torch.device | str = "cpu", dtype: str = "fp32", seed: int = 0) -> list[ProbeResult]:
    """The model-level probes of :mod:`harness.checks.properties` (finite gradients; causal leak and masked
    source keys in eval and train mode; extra source padding; prefix = whole target; the task-row probes on
    the default preset's task's rows, as :func:`run_checks`) on ``variant``.

    The threshold is the variant's own: ``max(atol, fudge * ref_error)`` of its logits. A variant that
    crashes gives one failed result whose detail is the crash.
    """
    s = CheckSession.create(registry, cfg, device=device, dtype=dtype, seed=seed,
                            task_rows=_rows(registry, "default", cfg, seed))
    with s.tf32_off():
        s.load_state([variant])
        run = s.run(variant)
        if run.error:
            return [ProbeResult(variant.name, "forward/backward", "eval", False, math.inf, s.tol.atol,
                                f"crashes: {run.error}")]
        return probe_model(s, variant)


def bug_reasons(registry: Registry, variant: Variant, cfg: ModelConfig | None = None, *,
                device: torch.device | str = "cpu", dtype: str = "fp32", seed: int = 0) -> BugResult:
    """Every reason the checks give to flag ``variant``: its components against their slots'
    references, a crash, failed probes, its attention against ``nn.MultiheadAttention`` and its
    stacks against ``nn.Transformer``. Empty reasons: nothing flags it."""
    report = run_checks(registry, [dataclasses.replace(variant, buggy=True)], cfg, device=device, dtype=dtype,
                        seed=seed)
    return report.bugs[0]
