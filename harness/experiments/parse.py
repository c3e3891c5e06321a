"""Reading experiment files: validation of the TOML document into an :class:`Experiment`,
lookup by name (``./experiments`` first, then the repository's) and the spec a run stored."""
from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from ..errors import HarnessError, UnknownNameError
from ..report import METRICS
from ..runner import MAX_TRIALS
from ..runmeta import RunMeta
from ..store import check_name
from .spec import (CHECKS, KINDS, MODEL_FIELDS, REPO_ROOT, TOP_KEYS, Experiment, ExperimentError, _bad, _config_key,
                   _eval_expr, _expect_str, _flatten, _validate_configs)

def parse_experiment(data: dict, where: str, default_name: str) -> Experiment:
    """Validate a TOML document (already parsed) into an :class:`Experiment`.

    Raises:
        ExperimentError: one line naming ``where``, the key, the expectation and the value.
    """
    for key in data:
        if key not in TOP_KEYS:
            raise _bad(where, key, f"one of the keys {', '.join(TOP_KEYS)}", key)
    name = _parse_name(data, where, default_name)
    description = _expect_str(data, "description", where, required=True)
    kind = _expect_str(data, "kind", where, default="train")
    if kind not in KINDS:
        raise _bad(where, "kind", f"one of {', '.join(KINDS)}", kind)
    preset = _expect_str(data, "preset", where, default="quick")
    variants = _parse_variants(data, where)
    seeds = _parse_seeds(data, where)
    baseline = _expect_str(data, "baseline", where) or None
    metric = _expect_str(data, "metric", where, default="")  # "": the task's primary metric (Task.primary_metric)
    if metric and metric not in METRICS and not (metric.isidentifier() and "task" in data):  # a task's own: plan.py
        raise _bad(where, "metric", f"one of {', '.join(METRICS)}", metric)
    overrides = _parse_config(data, where)
    sweep = _parse_sweep(data, where)
    analysis = _parse_analysis(data, where)
    measure = _parse_measure(data, where, kind, sweep)
    claims = _parse_claims(data, where)
    exp = Experiment(name=name, path=where, description=description, variants=tuple(variants), seeds=tuple(seeds),
                     kind=kind, preset=preset, baseline=baseline, metric=metric,
                     source=_expect_str(data, "source", where), notes=_expect_str(data, "notes", where),
                     overrides=overrides, sweep=tuple(sweep), analysis=analysis, measure=measure,
                     claims=tuple(claims))
    _validate_configs(exp, where)
    return exp


def _parse_name(data: dict, where: str, default_name: str) -> str:
    name = _expect_str(data, "name", where, default=default_name) or default_name
    try:
        if "name" in data:  # a name given in the file (the default is the file's own name)
            check_name(name, "experiment name")
    except HarnessError as exc:
        raise ExperimentError(f"{where}: key 'name': {exc}") from exc
    return name


def _parse_variants(data: dict, where: str) -> list[str]:
    variants = data.get("variants")
    if isinstance(variants, str):
        variants = [p.strip() for p in variants.replace(",", " ").split() if p.strip()]
    if not isinstance(variants, list) or not variants or not all(isinstance(v, str) and v for v in variants):
        raise _bad(where, "variants", "a non-empty list of variant names or globs", variants)
    return variants


def _parse_seeds(data: dict, where: str) -> list[int]:
    seeds = data.get("seeds")
    if isinstance(seeds, int) and not isinstance(seeds, bool) and 1 <= seeds <= MAX_TRIALS:
        return list(range(seeds))
    if not (isinstance(seeds, list) and seeds and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                      for s in seeds) and len(set(seeds)) == len(seeds)):
        raise _bad(where, "seeds", f"a positive integer (at most {MAX_TRIALS}) or a list of distinct "
                                   f"non-negative integers", seeds)
    return seeds


def _parse_config(data: dict, where: str) -> dict[str, Any]:
    """``[config]`` (and ``task``) as dotted overrides on the preset."""
    config = data.get("config", {})
    if not isinstance(config, dict):
        raise _bad(where, "config", "a table of model./train. keys", config)
    overrides = {}
    for k, v in _flatten(config).items():
        overrides[_config_key(k, where, "config")] = v
    if "task" in data:
        overrides["train.task"] = _expect_str(data, "task", where)
    return overrides


def _parse_sweep(data: dict, where: str) -> list[tuple[str, tuple]]:
    sweep_raw = data.get("sweep", {})
    if not isinstance(sweep_raw, dict):
        raise _bad(where, "sweep", "a table of config key = [values]", sweep_raw)
    sweep = []
    for k, vals in _flatten(sweep_raw).items():
        key = _config_key(k, where, "sweep")
        if not isinstance(vals, list) or not vals:
            raise _bad(where, f"sweep.{k}", "a non-empty list of values", vals)
        sweep.append((key, tuple(vals)))
    n_points = math.prod(len(v) for _, v in sweep)
    if n_points > MAX_TRIALS:
        raise _bad(where, "sweep", f"at most {MAX_TRIALS} points (the full factorial)", f"{n_points} points")
    return sweep


def _parse_analysis(data: dict, where: str) -> dict:
    analysis = data.get("analysis", {})
    if not isinstance(analysis, dict):
        raise _bad(where, "analysis", "a table", analysis)
    for k, v in analysis.items():
        if k not in ("fail_if_below", "fail_if_above"):
            raise _bad(where, f"analysis.{k}", "fail_if_below or fail_if_above", k)
        if not isinstance(v, dict) or not v:
            raise _bad(where, f"analysis.{k}", "a table such as { exact_match = 0.5 }", v)
        for m, thr in v.items():
            if m not in METRICS:
                raise _bad(where, f"analysis.{k}.{m}", f"a metric ({', '.join(METRICS)})", m)
            if not isinstance(thr, (int, float)) or isinstance(thr, bool):
                raise _bad(where, f"analysis.{k}.{m}", "a number", thr)
    return analysis


MEASURE_KEYS = ("batches", "parameter", "theory_slope")  #: keys of [measure] (kind = "grad_norm_at_init")


def _parse_measure(data: dict, where: str, kind: str, sweep: list) -> dict:
    measure = data.get("measure", {})
    if not isinstance(measure, dict):
        raise _bad(where, "measure", "a table", measure)
    if measure and kind != "grad_norm_at_init":
        raise _bad(where, "measure", "no [measure] table unless kind = \"grad_norm_at_init\"", measure)
    if kind != "grad_norm_at_init":
        return measure
    measure = {"batches": 16, "parameter": "feed_forward.w_2.weight", **measure}
    for k in measure:
        if k not in MEASURE_KEYS:
            raise _bad(where, f"measure.{k}", "batches, parameter or theory_slope", k)
    if not isinstance(measure["batches"], int) or isinstance(measure["batches"], bool) or measure["batches"] < 1:
        raise _bad(where, "measure.batches", "a positive integer", measure["batches"])
    if not isinstance(measure["parameter"], str) or not measure["parameter"]:
        raise _bad(where, "measure.parameter", "a parameter name inside a layer, e.g. feed_forward.w_2.weight",
                   measure["parameter"])
    theory = measure.get("theory_slope", {})
    if not (isinstance(theory, dict) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                             for v in theory.values())):
        raise _bad(where, "measure.theory_slope", "a table of variant = predicted log-log slope, e.g. "
                                                  "{ baseline = 0.0 }", theory)
    if [k for k, _ in sweep] != ["model.N"]:
        raise _bad(where, "sweep", "exactly one sweep, over N (the depth), for kind = \"grad_norm_at_init\"",
                   [k for k, _ in sweep])
    return measure


def _parse_claims(data: dict, where: str) -> list[dict]:
    claims = data.get("claim", [])
    if not isinstance(claims, list) or not all(isinstance(c, dict) for c in claims):
        raise _bad(where, "claim", "an array of tables ([[claim]])", claims)
    for i, c in enumerate(claims):
        _check_claim(c, f"claim[{i}]", where)
    return claims


def _check_claim(c: dict, ctx: str, where: str) -> None:
    for req in ("text", "check"):
        if not isinstance(c.get(req), str) or not c.get(req):
            raise _bad(where, f"{ctx}.{req}", "a non-empty string", c.get(req))
    if c["check"] not in CHECKS:
        raise _bad(where, f"{ctx}.check", f"one of {', '.join(CHECKS)}", c["check"])
    for req in CHECKS[c["check"]]:
        if req not in c:
            raise ExperimentError(f"{where}: key '{ctx}.{req}' is missing (check {c['check']!r} needs "
                                  f"{', '.join(CHECKS[c['check']])})")
    if c["check"] in ("verdict", "tuned_verdict") and c["expected"] not in ("better", "worse", "equivalent"):
        raise _bad(where, f"{ctx}.expected", "better, worse or equivalent", c["expected"])
    if c["check"] == "slope" and not (isinstance(c["within"], list) and len(c["within"]) == 2
                                      and all(isinstance(x, (int, float)) for x in c["within"])):
        raise _bad(where, f"{ctx}.within", "[low, high]", c["within"])
    if c["check"] == "params_difference":
        try:
            _eval_expr(str(c["expected"]), {k: 1 for k in MODEL_FIELDS})
        except ValueError as exc:
            raise _bad(where, f"{ctx}.expected", f"an arithmetic expression in {', '.join(sorted(MODEL_FIELDS))}",
                       c["expected"]) from exc


def load_experiment(path: str | Path) -> Experiment:
    """Read and validate one experiment file.

    Raises:
        ExperimentError: unreadable file, not UTF-8, TOML syntax error or a malformed key (one line).
    """
    path = Path(path)
    where = _display_path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ExperimentError(f"{where}: cannot read experiment file: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ExperimentError(f"{where}: not a text file in UTF-8 (byte {exc.object[exc.start:exc.start + 1]!r} "
                              f"at offset {exc.start}); experiment files are UTF-8 TOML") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ExperimentError(f"{where}: not valid TOML: {exc}") from exc
    return parse_experiment(data, where, path.stem)


def _display_path(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


def experiment_dirs() -> list[Path]:
    """Where experiments are looked up: ``./experiments`` first, then the repository's."""
    out = []
    for d in (Path.cwd() / "experiments", REPO_ROOT / "experiments"):
        if d.is_dir() and d.resolve() not in [o.resolve() for o in out]:
            out.append(d)
    return out


def experiment_files() -> dict[str, Path]:
    """name (file stem) -> path; a name in ``./experiments`` hides the repository's."""
    out: dict[str, Path] = {}
    for d in experiment_dirs():
        for p in sorted(d.glob("*.toml")):
            out.setdefault(p.stem, p)
    return out


def find_experiment(name: str) -> Path:
    """Resolve NAME (``experiments/NAME.toml``) or a path to a .toml file.

    Raises:
        ExperimentError: a path that does not exist.  UnknownNameError: an unknown name.
    """
    p = Path(name)
    if name.endswith(".toml") or os.sep in name or "/" in name:
        if p.is_file():
            return p
        raise ExperimentError(f"experiment file {name!r} not found (give a path to a .toml file or a name "
                              f"from: python -m harness experiments)")
    files = experiment_files()
    if name in files:
        return files[name]
    raise UnknownNameError("experiment", name, files, "see: python -m harness experiments")


def spec_from_meta(meta: RunMeta) -> Experiment | None:
    """The experiment a run was made from: stored in ``config.json``, else looked up by name.

    A grad-norm run stored before ``[measure] theory_slope`` existed takes the predicted slopes
    from the experiment file of the same name (when it still has them).
    """
    if meta.experiment_spec:
        exp = Experiment.from_meta(meta.experiment_spec)
        if exp.kind == "grad_norm_at_init" and "theory_slope" not in exp.measure:
            exp = _with_file_theory(exp, meta.experiment or exp.name)
        return exp
    if meta.experiment:
        try:
            return load_experiment(find_experiment(meta.experiment))
        except HarnessError:
            return None
    return None



def _with_file_theory(exp: Experiment, name: str) -> Experiment:
    try:
        theory = load_experiment(find_experiment(name)).measure.get("theory_slope")
    except HarnessError:
        return exp
    if theory is None:
        return exp
    return dataclasses.replace(exp, measure={**exp.measure, "theory_slope": theory})
