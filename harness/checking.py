"""Check from a :class:`harness.request.CheckRequest`: the one path that ``python -m harness check``
and :func:`harness.check` take (:func:`start_check`).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from .config import get_preset, parse_overrides, resolve_key
from .errors import ConfigError
from .launch import load_registry, log_function
from .registry import Registry
from .request import CheckRequest, check_dtype
from .env import resolve_device


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


def start_check(req: CheckRequest, reg: Registry | None = None):
    """Run check on ``req`` (equivalence matrix, PyTorch references, mask probes, faithful bugs).

    Returns:
        tuple: ``(report, variants, cfg, groups)``: the :class:`harness.checks.CheckReport`, the
        variants checked, the model config and the equivalence groups used.

    Raises:
        HarnessError: unknown variant or component, bad config, bad ``equivalent`` item.
    """
    from .checks import parse_equivalent, registry_groups, run_checks

    check_dtype(req.dtype)
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
    report = run_checks(reg, variants, cfg, device=device, dtype=req.dtype, seed=req.seed, groups=groups,
                        log=log_function(req.quiet), all_components=req.all_components)
    return report, variants, cfg, groups
