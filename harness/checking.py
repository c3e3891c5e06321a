"""Check from a :class:`harness.request.CheckRequest`: the one path that ``python -m harness check``
and :func:`harness.check` take (:func:`start_check`: the checks, then the record under
``<results-dir>/checks/<run-id>/``; see :mod:`harness.checks` for the recipe and docs/checks.md).
"""
from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from .config import get_preset, resolve_key
from .settings import parse_overrides
from .env import environment, resolve_device, threads_pinned
from .errors import ConfigError, StoreError
from .launch import log_function
from .planning import load_registry
from .registry import Registry
from .request import CheckOutcome, CheckRequest, check_dtype
from .runmeta import RunMeta
from .store import CHECKS_DIR, RunStore, atomic_write_text, check_name, config_path


def check_model_config(preset: str | None, overrides) -> Any:
    """The check config (or ``preset``'s model) with ``model.*`` overrides.

    Raises:
        ConfigError: a ``train.*`` override (check builds models only) or an invalid value.
    """
    from .checks import CHECK_MODEL
    from .config import ModelConfig

    base = get_preset(preset).model if preset else CHECK_MODEL
    values = dataclasses.asdict(base)
    for key, value in parse_overrides(list(overrides)).items():
        if key.rpartition(".")[0] == "train":
            raise ConfigError(f"check builds models only: --set {key} does not apply (use model.<name>, "
                              f"e.g. --set model.d_model=64)")
        values[resolve_key(key, ("model",))[1]] = value  # unknown keys: the closest ones, aliases
    return ModelConfig.from_dict(values)


def checks_dir(results_dir: str | Path) -> Path:
    """``<results_dir>/checks``, where check records go (apart from the runs, so a dozen checks
    do not crowd ``ls results`` and ``report latest``).

    Raises:
        StoreError: that folder is a run's (a ``run --run-id checks``), not a folder of records.
        ConfigError: ``results_dir`` is empty.
    """
    if str(results_dir) == "":
        raise ConfigError("--results-dir must not be empty (give a folder, e.g. --results-dir results)")
    folder = Path(results_dir) / CHECKS_DIR
    if config_path(folder) is not None:
        raise StoreError(f"{str(folder)!r} is a run folder, but check records go there; rename that run "
                         f"or give check another --results-dir")
    return folder


def start_check(req: CheckRequest, reg: Registry | None = None) -> CheckOutcome:
    """Run check on ``req`` (equivalence matrix, PyTorch references, mask probes, faithful bugs)
    and write its record: ``<results_dir>/checks/<run-id>/`` with ``config.json`` (kind
    ``check``), ``checks.csv`` and ``checks.md``. ``python -m harness check`` and
    :func:`harness.check` both call it, so both leave the same record.

    Returns:
        CheckOutcome: the :class:`harness.checks.CheckReport`, the record, the variants checked,
        the model config and the equivalence groups used.

    Raises:
        HarnessError: unknown variant or component, bad config, bad ``equivalent`` item, bad
        ``run_id``, a run folder where the records go (all before the checks run).
    """
    from .checks import parse_equivalent, registry_groups, run_checks
    from .checks.properties.rows import preset_task_rows

    check_dtype(req.dtype)
    if req.threads is not None and (not isinstance(req.threads, int) or req.threads < 1):
        raise ConfigError(f"--threads must be an integer >= 1 (0 on the command line: torch's default), got {req.threads!r}")
    if req.run_id is not None:
        check_name(req.run_id)
    folder = checks_dir(req.results_dir)
    reg = reg or load_registry(req.plugins)
    variants = reg.grid() if req.grid else reg.select(req.patterns())
    cfg = check_model_config(req.preset, req.overrides)
    device = resolve_device(req.device)
    extra = parse_equivalent(list(req.equivalent))
    for slot, groups in extra.items():
        for group in groups:
            for name in group:
                reg.component(slot, name)  # UnknownNameError for a typo
    groups = registry_groups(reg, extra, cfg)
    with threads_pinned(req.threads) as threads:
        report = run_checks(reg, variants, cfg, device=device, dtype=req.dtype, seed=req.seed, groups=groups,
                            log=log_function(req.quiet), all_components=req.all_components,
                            task_rows=preset_task_rows(reg, req.preset, cfg, req.seed))
    slow = slow_check_note(report.wall_s, len(variants), threads)
    if slow:
        print(slow, file=sys.stderr, flush=True)
    store, meta = write_check_record(req, folder, report, variants, cfg, groups, device)
    return CheckOutcome(report, store, meta, variants, cfg, groups)


def write_check_record(req: CheckRequest, folder: Path, report, variants, cfg, groups, device) -> tuple[RunStore, RunMeta]:
    """The check's record under ``folder`` (``config.json``, ``checks.csv``, ``checks.md``).

    Raises:
        StoreError: the record cannot be written (or ``req.run_id`` exists already).
    """
    from .checks import render_markdown, results_frame

    meta = RunMeta("check", req.command_line(), "", {"model": dataclasses.asdict(cfg)}, [v.name for v in variants],
                   device.type, environment(device), seeds=[req.seed], dtype=req.dtype,
                   plugins=req.plugins.to_dict(),
                   equivalent={s: sorted(sorted(g) for g in gs) for s, gs in groups.items()},
                   tf32=report.tf32, check_wall_s=report.wall_s, ok=report.ok)
    store = RunStore.create(folder, meta, req.run_id, prefix="check-")  # sets meta.run_id
    atomic_write_text(store.root / "checks.csv", results_frame(report).to_csv(index=False))
    atomic_write_text(store.root / "checks.md", render_markdown(report, meta))
    return store, meta


#: seconds per checked variant above which ``check`` says why it may be slow
SLOW_CHECK_S_PER_VARIANT = 2.0


def slow_check_note(wall_s: float, n_variants: int, threads: int) -> str:
    """One line when a check took over :data:`SLOW_CHECK_S_PER_VARIANT` per variant (about 10x its time
    on a quiet core), naming the likely cause: other processes on the cores (load average) or threads."""
    if wall_s <= SLOW_CHECK_S_PER_VARIANT * max(1, n_variants):
        return ""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"harness: note: check took {wall_s:.1f} s for {n_variants} variant(s) with {threads} torch thread(s); "
            f"load average {load:.1f} on {os.cpu_count()} core(s): other processes share the cores"
            + (" and more threads than free cores oversubscribe them (try --threads 1)" if threads > 1 else ""))
