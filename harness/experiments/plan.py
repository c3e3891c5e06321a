"""Planning a run from an experiment file: :func:`plan_from_experiment` -> :class:`harness.runner.Plan`."""
from __future__ import annotations

import dataclasses
from typing import Any

from ..config import get_preset
from ..settings import parse_overrides
from ..errors import ConfigError, HarnessError, UnknownNameError
from ..runner import Plan, check_plan_size
from .grad_norm import check_parameter
from .parse import find_experiment, load_experiment
from .spec import Experiment, ExperimentError, _bad, _config_key, _validate_configs



def plan_from_experiment(name: str, registry, request, exp=None):
    """The :class:`harness.runner.Plan` of experiment NAME (or a path to a .toml file), or of
    ``exp`` (an :class:`~harness.experiments.spec.Experiment`, e.g. the one a run stored: a run
    made from a file that is elsewhere now, or from a path, resumes from its own record).

    ``request`` (a :class:`harness.request.RunRequest`) supplies overrides (``seeds=N`` among them
    sets the seeds) and ``seeds`` / ``seed_start`` (used when ``seeds`` was given). A
    ``grad_norm_at_init`` experiment gets ``plan.kind`` and ``plan.measure`` (what each trial
    measures instead of training); it runs through :func:`harness.launch.start_run` like any run.

    Raises:
        ExperimentError / UnknownNameError: unknown experiment, malformed file, unknown
        variant, a bad override, or (a measurement) a ``measure.parameter`` no layer has.
    """
    exp = exp if exp is not None else load_experiment(find_experiment(name))
    overrides = parse_overrides(list(request.overrides))
    seeds_override = overrides.pop("seeds", None)
    if seeds_override is None and request.seeds is not None:
        seeds_override = request.seeds
    changes: dict[str, Any] = {}
    if seeds_override is not None:
        if not isinstance(seeds_override, int) or isinstance(seeds_override, bool) or seeds_override < 1:
            raise ConfigError(f"seeds must be a positive integer, got {seeds_override!r}")
        check_plan_size(1, seeds_override)
        start = int(request.seed_start or 0)
        if start < 0:
            raise ConfigError(f"--seed-start must be >= 0, got {start}")
        changes["seeds"] = tuple(range(start, start + seeds_override))
    if overrides:
        merged = dict(exp.overrides)
        for k, v in overrides.items():
            merged[_config_key(k, "--set", "set")] = v
        changes["overrides"] = merged
    if changes:
        exp = dataclasses.replace(exp, **changes)
        _validate_configs(exp, f"{exp.path} with --set")
    try:
        variants = registry.select(list(exp.variants))
    except UnknownNameError as exc:
        raise ExperimentError(f"{exp.path}: key 'variants': {exc}") from exc
    names = [v.name for v in variants]
    _check_metric(exp, registry)
    check_plan_size(len(variants), len(exp.seeds), exp.n_points)
    if exp.baseline and exp.baseline not in names:
        raise _bad(exp.path, "baseline", f"one of the experiment's variants ({', '.join(names)})", exp.baseline)
    plan = Plan(variants, list(exp.seeds), exp.points(), preset=exp.preset, name=exp.name,
                meta={"experiment_spec": exp.to_meta(), "cli_overrides": list(request.overrides)})
    if exp.kind == "grad_norm_at_init":
        check_parameter(plan, exp, registry)
        plan.kind = exp.kind
        plan.measure = {"kind": exp.kind, "batches": exp.measure["batches"], "parameter": exp.measure["parameter"]}
    return plan


def _check_metric(exp: Experiment, registry) -> None:
    """Raise ExperimentError when the experiment's ``metric`` is not one its task declares for verdicts
    (``Task.metrics``; the task: ``task = ...``, else the preset's ``train.task``)."""
    if not exp.metric or exp.kind != "train":
        return
    task = registry.task(str(exp.overrides.get("train.task", get_preset(exp.preset).train.task)))
    usable = [m.name for m in task.metrics if m.verdict]
    if exp.metric not in usable:
        raise _bad(exp.path, "metric", f"a metric task {task.name!r} declares ({', '.join(usable)})", exp.metric)


def n_trials(exp: Experiment, registry) -> int | None:
    """variants x seeds x sweep points, or None when the variants do not resolve."""
    try:
        return len(registry.select(list(exp.variants))) * len(exp.seeds) * exp.n_points
    except HarnessError:
        return None

