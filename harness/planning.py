"""A run request resolved in one pass, before anything is stored: :func:`plan_new_run` (request -> validated
request -> :class:`RunPlan`: registry, config, trial specs, execution) and :func:`plan_resume` (request + stored run
-> :class:`ResumePlan`, every comparison of the stored plan with the requested one made by
:func:`harness.resume.compare`, in one place). :mod:`harness.launch` then stores and executes the plan; nothing
here writes a file.

Raises everywhere: :class:`harness.errors.HarnessError` for bad input (exit 2 on the command line),
:class:`harness.errors.StoreError` for a resume the stored run refuses.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from .config import DEFAULT_PRESET, get_preset, resolve_key
from .env import resolve_device
from .errors import ConfigError
from .experiments import plan_from_experiment, spec_from_meta
from .plugins import PluginSpec
from .provenance import current_code
from .registry import Registry
from .request import CONFIG_OPTIONS, TRIAL_OPTIONS, RunRequest
from .resume import Requested, compare
from .runner import Plan, lr_grid_points, make_specs, with_threads
from .runmeta import MAX_GROUP, Execution, RunMeta
from .saved import with_save_model
from .schedule import peak_lr
from .settings import parse_overrides
from .store import RunStore
from .tboard import check_available
from .track import check_mlflow
from .trial import TrialSpec

#: Execution options a resume may give (else it runs as the stored run ran).
EXECUTION_OPTIONS = {"executor", "jobs", "threads", "address", "vectorise_seeds", "capture"}


@dataclass
class RunPlan:
    """A new run's request resolved: its registry, :class:`harness.runner.Plan` (variants, seeds, config points),
    trial ``specs`` (threads, saved models), ``options`` (resolved for these trials on ``device``), ``dtype`` and
    the plugins as stored."""

    request: RunRequest
    registry: Registry
    plan: Plan
    specs: list[TrialSpec]
    options: Execution
    device: str
    dtype: str
    plugins: dict


@dataclass
class ResumePlan:
    """A resume request resolved against its stored run: the store and its ``meta``, the registry of the stored
    plugins, every stored trial (``specs``), the code now and how it changed (``changes``), the execution
    ``options`` (the stored ones unless the request gives some) and the trials to run (``todo``, after
    ``--retry-failed`` retired the failed ones: ``retried``)."""

    request: RunRequest
    store: RunStore
    meta: RunMeta
    registry: Registry
    specs: list[TrialSpec]
    code: Any
    changes: list[str] | None
    options: Execution
    todo: list[TrialSpec] = field(default_factory=list)
    retried: list[str] = field(default_factory=list)


def load_registry(plugins: PluginSpec) -> Registry:
    """The registry with ``plugins`` loaded; its warnings as ``harness: warning:`` lines on stderr."""
    reg = Registry.from_plugins(plugins)
    for w in reg.warnings:
        print(f"harness: warning: {w}", file=sys.stderr)
    return reg



def resolve_config(preset: str, overrides, registry: Registry | None = None) -> Any:
    """Preset + ``--set`` items, validated; with ``registry``, then fitted to the task
    (:meth:`harness.Task.fit`: e.g. ``g2p`` raises ``model.vocab`` and ``model.max_len`` that the
    items do not set). Raises UnknownNameError / ConfigError."""
    cfg = get_preset(preset)
    values = parse_overrides(list(overrides))
    cfg = cfg.override(values) if values else cfg.validate()
    if registry is None:
        return cfg
    given = {".".join(resolve_key(k)) for k in values}
    return registry.task(cfg.train.task).for_config(cfg).fit(cfg, given)


def check_experiment_options(given: set[str]) -> None:
    """With an experiment the file decides the variants and the preset: ``variants``, ``grid``
    and ``preset`` are refused rather than ignored, and ``seed_start`` needs ``seeds``.

    Raises:
        ConfigError: naming the option.
    """
    for name, flag in (("variants", "--variants"), ("grid", "--grid"), ("preset", "--preset")):
        if name in given:
            raise ConfigError(f"{flag} cannot be combined with --experiment: the experiment file decides its "
                              f"variants and preset (override its config with --set KEY=VALUE, its seeds with "
                              f"--seeds N)")
    if "seed_start" in given and "seeds" not in given:
        raise ConfigError("--seed-start with --experiment needs --seeds N (without it the file's seeds are used)")
    if "lr_grid" in given:
        raise ConfigError("--lr-grid cannot be combined with --experiment: sweep the learning rate in the file "
                          "([sweep] \"train.lr\" = [...]); its report then chooses each variant's learning rate")


def plan_run(req: RunRequest, reg: Registry) -> Plan:
    """The run's plan from its experiment, or from its variants/grid, preset/overrides and seeds.

    Raises:
        HarnessError: unknown variant/preset/task, bad override, too many trials.
    """
    if req.experiment:
        return plan_from_experiment(req.experiment, reg, req)
    preset = req.preset or DEFAULT_PRESET
    cfg = resolve_config(preset, req.overrides, reg)
    variants = reg.grid() if req.grid else reg.select(req.patterns())
    if req.lr_grid is None:
        return Plan(variants, req.seed_list(len(variants)), [("", cfg)], preset=preset)
    points = lr_grid_points(cfg, req.lr_grid)
    seeds = req.seed_list(len(variants) * len(points))
    return Plan(variants, seeds, points, preset=preset, base=cfg,
                meta={"lr_grid": {"default": peak_lr(cfg.train, cfg.model.d_model),
                                  "values": [float(v) for v in req.lr_grid]}})


def device_name(name: str, options: Execution) -> str:
    """The device the trials use. On Ray an explicit ``cuda`` is checked on the workers, not here
    (the driver may have no GPU); everything else must be available on this machine."""
    if options.executor == "ray" and name.startswith("cuda"):
        return "cuda"
    return resolve_device(name).type


def execution_options(req: RunRequest) -> Execution:
    """The request's execution options validated; Ray imported early when asked for, so a missing
    Ray is reported before anything is stored."""
    opts = req.execution()
    if opts.executor == "ray":
        from .executors.ray_cluster import import_ray

        import_ray()
    return opts


def check_switches() -> None:
    """The environment switches a run's trials read (``HARNESS_PREFIX_PASS``,
    ``harness.tasks.prefix``; ``HARNESS_CAPTURE``, :func:`harness.vectorisable.capture_env`), checked
    before anything is stored: a bad value is bad input, not a failed trial.

    Raises:
        ConfigError: a value the switch does not take (the message names the variable and its values).
    """
    from .env import prefix_pass
    from .vectorisable import capture_env

    try:
        prefix_pass()
    except ValueError as exc:
        raise ConfigError(f"{exc} (or unset it)") from None
    capture_env()


def check_tracking(req: RunRequest, options: Execution) -> None:
    """``--tensorboard`` / ``--mlflow`` refused before anything is stored.

    Raises:
        ConfigError: its package is not installed; ``--mlflow`` with ``--executor ray``.
    """
    if req.tensorboard is not None:
        check_available()
    if req.mlflow is not None:
        if options.executor == "ray":
            raise ConfigError("--mlflow logs from the processes that train the trials, which --executor ray "
                              "places on other machines: use the local executor (--jobs N) with --mlflow")
        check_mlflow()


def resolved_for(options: Execution, specs: list[TrialSpec], device: str) -> Execution:
    """``options`` resolved (:meth:`Execution.resolved`) for running ``specs`` on ``device``: the trials
    and the trial groups they would form (:func:`harness.group.group_specs`)."""
    from .group import group_specs

    return options.resolved(len(specs), device, len(group_specs(specs, MAX_GROUP)))


def plan_new_run(req: RunRequest) -> RunPlan:
    """A new run's request, validated and resolved once: switches, experiment options, execution, registry, plan,
    each config point against its task, device, trial specs, execution resolved for them, live tracking."""
    req.validate()
    check_switches()
    given = req.given()
    if "experiment" in given:
        check_experiment_options(given)
    options = execution_options(req)
    reg = load_registry(req.plugins)
    plan = plan_run(req, reg)
    for _, point in plan.points:
        reg.task(point.train.task).for_config(point).validate(point)
    device, dtype = device_name(req.device or "auto", options), req.dtype or "fp32"
    plugins = req.plugins.to_dict()
    specs = make_specs(plan.variants, plan.seeds, plan.config, device, dtype, plugins, points=plan.points,
                       measure=plan.measure)
    options = resolved_for(options, specs, device)
    specs = with_threads(specs, options.trial_threads())
    specs = with_save_model(specs) if req.save_models else specs
    check_tracking(req, options)
    return RunPlan(req, reg, plan, specs, options, device, dtype, plugins)


def plan_resume(req: RunRequest) -> ResumePlan:
    """A resume request (``req.resume``) against its stored run: the stored plan and the requested one compared in
    one place (:func:`harness.resume.compare`), the execution options (the stored ones unless given). Reads the
    store; writes nothing (``--retry-failed``'s retiring is the launcher's first write)."""
    req.validate()
    check_switches()
    given = req.given()
    options = execution_options(req)
    store = RunStore.open(req.resume)
    meta = store.meta()
    reg = load_registry(PluginSpec.from_dict(meta.plugins))
    code = current_code(PluginSpec.from_dict(meta.plugins))
    specs, changes = compare(store, meta, reg, code.record, requested(req, given, meta, reg), req.allow_code_change)
    if not given & EXECUTION_OPTIONS and meta.execution is not None:
        stored = meta.execution
        options = Execution(stored.executor, stored.jobs, stored.threads, stored.address,
                            stored.vectorise_seeds, stored.capture, req.trial_timeout, req.time_budget).validate()
    return ResumePlan(req, store, meta, reg, specs, code, changes, options)


def requested(req: RunRequest, given: set[str], meta: RunMeta, reg) -> Requested:
    """What the options given with ``--resume`` ask for, for :func:`harness.resume.compare` (the plan itself
    lazily: it is compared after the stored trials' components are known to be registered)."""
    return Requested(plugins=req.plugins.to_dict() if "plugins" in given else None,
                     device=device_name(req.device, Execution()) if "device" in given else None,
                     dtype=req.dtype if "dtype" in given else None,
                     plan=(lambda: requested_plan(req, given, meta, reg))
                     if given & (CONFIG_OPTIONS | TRIAL_OPTIONS) else None,
                     config=bool(given & CONFIG_OPTIONS), trials=bool(given & TRIAL_OPTIONS), baseline=req.baseline)


def requested_plan(req: RunRequest, given: set[str], meta: RunMeta, reg) -> tuple[list[str], list[int], list]:
    """``(variant names, seeds, [(point name, RunConfig)])`` that the options given with ``resume``
    ask for; what was not given is taken from the stored run (``meta``).

    Raises:
        HarnessError: the given options themselves are bad (unknown variant, bad override, ...).
    """
    experiment = req.experiment if "experiment" in given else (meta.experiment or None)
    if experiment:
        check_experiment_options(given)
        stored = None if "experiment" in given else spec_from_meta(meta)  # the run's own record, not the name
        plan = plan_from_experiment(experiment, reg, req, exp=stored)
        return [v.name for v in plan.variants], plan.seeds, plan.points
    preset = req.preset if "preset" in given else (meta.preset or DEFAULT_PRESET)
    points = [("", resolve_config(preset, req.overrides, reg))]
    grid = req.lr_grid if "lr_grid" in given else (meta.lr_grid or {}).get("values")
    if grid:
        points = lr_grid_points(points[0][1], grid)
    if given & {"variants", "grid"}:
        variants = [v.name for v in (reg.grid() if req.grid else reg.select(req.patterns()))]
    else:
        variants = list(meta.variants)
    if given & {"seeds", "seed_start"}:
        seeds = req.seed_list(len(variants))
    else:
        seeds = list(meta.seeds or [])
    return variants, seeds, points
