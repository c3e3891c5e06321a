"""Planning a run from an experiment file: :func:`plan_from_experiment` -> :class:`harness.runner.Plan`."""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

from ..config import parse_overrides
from ..errors import ConfigError, HarnessError, UnknownNameError
from ..runner import Plan, check_plan_size
from .grad_norm import run_grad_norm
from .parse import find_experiment, load_experiment
from .spec import Experiment, ExperimentError, _bad, _config_key, _validate_configs



def plan_from_experiment(name: str, registry, args):
    """The :class:`harness.runner.Plan` of experiment NAME (or a path to a .toml file).

    ``args`` supplies ``--set`` overrides (``--set seeds=N`` sets the seeds), ``--seeds`` /
    ``--seed-start`` (used when ``args.seeds_given``, or, without that attribute, when
    ``--seeds`` is not 1). A ``grad_norm_at_init`` experiment
    gets ``plan.measure`` (it measures instead of training).

    Raises:
        ExperimentError / UnknownNameError: unknown experiment, malformed file, unknown
        variant, or a bad override.
    """
    exp = load_experiment(find_experiment(name))
    overrides = parse_overrides(list(getattr(args, "overrides", None) or []))
    seeds_override = overrides.pop("seeds", None)
    seeds_given = getattr(args, "seeds_given", None)  # set by 'run': --seeds given explicitly
    if seeds_given is None:
        seeds_given = getattr(args, "seeds", 1) not in (1, None)
    if seeds_override is None and seeds_given:
        seeds_override = args.seeds
    changes: dict[str, Any] = {}
    if seeds_override is not None:
        if not isinstance(seeds_override, int) or isinstance(seeds_override, bool) or seeds_override < 1:
            raise ConfigError(f"seeds must be a positive integer, got {seeds_override!r}")
        check_plan_size(1, seeds_override)
        start = int(getattr(args, "seed_start", 0) or 0)
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
    check_plan_size(len(variants), len(exp.seeds), exp.n_points)
    if exp.baseline and exp.baseline not in names:
        raise _bad(exp.path, "baseline", f"one of the experiment's variants ({', '.join(names)})", exp.baseline)
    plan = Plan(variants, list(exp.seeds), exp.points(), preset=exp.preset, name=exp.name,
                meta={"experiment_spec": exp.to_meta(), "cli_overrides": list(getattr(args, "overrides", None) or [])})
    if exp.kind == "grad_norm_at_init":
        plan.measure = functools.partial(run_grad_norm, exp=exp, registry=registry)
    return plan


def n_trials(exp: Experiment, registry) -> int | None:
    """variants x seeds x sweep points, or None when the variants do not resolve."""
    try:
        return len(registry.select(list(exp.variants))) * len(exp.seeds) * exp.n_points
    except HarnessError:
        return None

