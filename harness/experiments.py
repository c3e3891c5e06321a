"""Declarative experiments: ``experiments/<name>.toml`` -> a :class:`harness.runner.Plan`.

An experiment file fixes everything a run needs -- task, config, variants, seeds, sweeps -- and
what to conclude from it (baseline, comparison metric, failure definition, the published
claims it checks). ``python -m harness run --experiment NAME`` runs it, ``python -m harness
experiments`` lists them, and the run's report gains the experiment's sections. Format
(documented with examples in ``docs/statistics.md``)::

    description = "one line"                 # required
    variants = ["baseline", "pre_norm"]      # required: names/globs as for --variants
    seeds = 10                               # required: n (seeds 0..n-1) or a list of seeds
    kind = "train"                           # or "grad_norm_at_init" (a measurement, no training)
    preset = "quick"                         # base config (default quick)
    task = "copy"                            # shorthand for config.train.task
    baseline = "baseline"                    # compared against; default "baseline" if selected
    metric = "heldout_ce"                    # metric of P(variant > baseline)
    source = "Xiong et al. 2020 §3.4"        # what the experiment reproduces
    notes = "caveats known before running"

    [config]                                 # overrides on the preset (dotted or nested)
    model.d_model = 32
    train.steps = 300

    [sweep]                                  # full factorial; short names (lr, N) or dotted keys
    lr = [0.5, 1.0]

    [analysis]                               # optional failure definition
    fail_if_below = { exact_match = 0.5 }    # failed to converge: diverged, or exact_match < 0.5
    fail_if_above = { heldout_ce = 2.3 }

    [measure]                                # kind = "grad_norm_at_init" only
    batches = 16
    parameter = "feed_forward.w_2.weight"

    [[claim]]                                # checked automatically in the report
    text = "..."; source = "..."; check = "verdict"; variant = "shared_embeddings"; expected = "equivalent"

Claim checks: ``verdict`` (variant, expected), ``params_difference`` (a, b, expected: an
expression in the model config's symbols such as ``"2*vocab*d_model"``),
``failure_rate_greater`` (a, b), ``slope`` (variant, within = [lo, hi], stack), and
``ratio_greater`` (a, b, N, min_fraction). Each reports ``reproduced``, ``not reproduced`` or
``inconclusive`` with its evidence.

Command-line options on top of a file: ``--set KEY=VALUE`` overrides its config (and
``--set seeds=N`` its seeds); ``--seeds N`` (with ``--seed-start S``) also overrides the seeds.
``--variants``, ``--grid`` and ``--preset`` are refused (the file decides).

Errors: a malformed file raises :class:`ExperimentError` (exit 2) with one line naming the
file, the key, what was expected and what was found.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import itertools
import json
import math
import operator
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from .config import ModelConfig, RunConfig, TrainConfig, get_preset
from .errors import ConfigError, HarnessError, UnknownNameError

REPO_ROOT = Path(__file__).resolve().parents[1]
KINDS = ("train", "grad_norm_at_init")
TOP_KEYS = ("name", "description", "kind", "preset", "task", "variants", "seeds", "baseline", "metric",
            "source", "notes", "config", "sweep", "analysis", "measure", "claim")
#: check -> required keys (besides text and check)
CHECKS: dict[str, tuple[str, ...]] = {
    "verdict": ("variant", "expected"),
    "params_difference": ("a", "b", "expected"),
    "failure_rate_greater": ("a", "b"),
    "slope": ("variant", "within"),
    "ratio_greater": ("a", "b", "N", "min_fraction"),
}
MODEL_FIELDS = {f.name for f in dataclasses.fields(ModelConfig)}
TRAIN_FIELDS = {f.name for f in dataclasses.fields(TrainConfig)}


class ExperimentError(ConfigError):
    """An experiment file is missing, unreadable or malformed (exit code 2)."""


def _bad(where: str, key: str, expected: str, got: Any) -> ExperimentError:
    return ExperimentError(f"{where}: key {key!r}: expected {expected}, got {got!r}")


# ----------------------------------------------------------------------------- the spec

@dataclass(frozen=True)
class Experiment:
    """A parsed experiment file (see the module docstring for the format)."""

    name: str
    path: str
    description: str
    variants: tuple[str, ...]
    seeds: tuple[int, ...]
    kind: str = "train"
    preset: str = "quick"
    baseline: str | None = None
    metric: str = "heldout_ce"
    source: str = ""
    notes: str = ""
    overrides: dict = field(default_factory=dict)
    sweep: tuple = ()  #: ((dotted key, (values...)), ...)
    analysis: dict = field(default_factory=dict)
    measure: dict = field(default_factory=dict)
    claims: tuple = ()

    def base_config(self) -> RunConfig:
        """The preset with the file's ``[config]`` overrides (validated)."""
        cfg = get_preset(self.preset)
        return cfg.override(self.overrides) if self.overrides else cfg.validate()

    def points(self) -> list[tuple[str, RunConfig]]:
        """``[(point name, config)]`` over the full factorial of the sweep; ``[("", cfg)]`` without one."""
        base = self.base_config()
        if not self.sweep:
            return [("", base)]
        keys = [k for k, _ in self.sweep]
        out = []
        for combo in itertools.product(*(vals for _, vals in self.sweep)):
            name = ",".join(f"{k.partition('.')[2]}={_fmt_value(v)}" for k, v in zip(keys, combo))
            out.append((name, base.override(dict(zip(keys, combo)))))
        return out

    @property
    def n_points(self) -> int:
        return math.prod(len(v) for _, v in self.sweep) if self.sweep else 1

    def to_meta(self) -> dict:
        """JSON-able form stored in the run's ``config.json`` (``experiment_spec``)."""
        d = dataclasses.asdict(self)
        d["sweep"] = [[k, list(v)] for k, v in self.sweep]
        d["variants"], d["seeds"], d["claims"] = list(self.variants), list(self.seeds), list(self.claims)
        return d

    @classmethod
    def from_meta(cls, d: dict) -> "Experiment":
        d = dict(d)
        d["sweep"] = tuple((k, tuple(v)) for k, v in d.get("sweep", []))
        d["variants"], d["seeds"] = tuple(d.get("variants", ())), tuple(d.get("seeds", ()))
        d["claims"] = tuple(d.get("claims", ()))
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


def _fmt_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def _config_key(key: str, where: str, ctx: str) -> str:
    """``lr`` -> ``train.lr``, ``N`` -> ``model.N``; dotted keys are checked."""
    section, dot, name = key.partition(".")
    if dot:
        known = MODEL_FIELDS if section == "model" else TRAIN_FIELDS if section == "train" else None
        if known is None:
            raise _bad(where, f"{ctx}.{key}", "a key under model. or train.", key)
        if name not in known:
            raise _bad(where, f"{ctx}.{key}", f"a {section} config key ({', '.join(sorted(known))})", name)
        return key
    if key in MODEL_FIELDS:
        return f"model.{key}"
    if key in TRAIN_FIELDS:
        return f"train.{key}"
    raise _bad(where, f"{ctx}.{key}", f"a model or train config key ({', '.join(sorted(MODEL_FIELDS | TRAIN_FIELDS))})",
               key)


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _expect_str(data: dict, key: str, where: str, required: bool = False, default: str = "") -> str:
    if key not in data:
        if required:
            raise ExperimentError(f"{where}: missing required key {key!r} (expected a string)")
        return default
    v = data[key]
    if not isinstance(v, str) or (required and not v.strip()):
        raise _bad(where, key, "a non-empty string" if required else "a string", v)
    return v


def parse_experiment(data: dict, where: str, default_name: str) -> Experiment:
    """Validate a TOML document (already parsed) into an :class:`Experiment`.

    Raises:
        ExperimentError: one line naming ``where``, the key, the expectation and the value.
    """
    for key in data:
        if key not in TOP_KEYS:
            raise _bad(where, key, f"one of the keys {', '.join(TOP_KEYS)}", key)
    name = _expect_str(data, "name", where, default=default_name) or default_name
    from .store import check_name

    try:
        if "name" in data:  # a name given in the file (the default is the file's own name)
            check_name(name, "experiment name")
    except HarnessError as exc:
        raise ExperimentError(f"{where}: key 'name': {exc}") from exc
    description = _expect_str(data, "description", where, required=True)
    kind = _expect_str(data, "kind", where, default="train")
    if kind not in KINDS:
        raise _bad(where, "kind", f"one of {', '.join(KINDS)}", kind)
    preset = _expect_str(data, "preset", where, default="quick")
    variants = data.get("variants")
    if isinstance(variants, str):
        variants = [p.strip() for p in variants.replace(",", " ").split() if p.strip()]
    if not isinstance(variants, list) or not variants or not all(isinstance(v, str) and v for v in variants):
        raise _bad(where, "variants", "a non-empty list of variant names or globs", variants)
    seeds = data.get("seeds")
    from .runner import MAX_TRIALS

    if isinstance(seeds, int) and not isinstance(seeds, bool) and 1 <= seeds <= MAX_TRIALS:
        seeds = list(range(seeds))
    elif not (isinstance(seeds, list) and seeds and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                        for s in seeds) and len(set(seeds)) == len(seeds)):
        raise _bad(where, "seeds", f"a positive integer (at most {MAX_TRIALS}) or a list of distinct "
                                   f"non-negative integers", seeds)
    baseline = _expect_str(data, "baseline", where) or None
    from .report import METRICS

    metric = _expect_str(data, "metric", where, default="heldout_ce")
    if metric not in METRICS:
        raise _bad(where, "metric", f"one of {', '.join(METRICS)}", metric)
    config = data.get("config", {})
    if not isinstance(config, dict):
        raise _bad(where, "config", "a table of model./train. keys", config)
    overrides = {}
    for k, v in _flatten(config).items():
        overrides[_config_key(k, where, "config")] = v
    if "task" in data:
        overrides["train.task"] = _expect_str(data, "task", where)
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
    measure = data.get("measure", {})
    if not isinstance(measure, dict):
        raise _bad(where, "measure", "a table", measure)
    if measure and kind != "grad_norm_at_init":
        raise _bad(where, "measure", "no [measure] table unless kind = \"grad_norm_at_init\"", measure)
    if kind == "grad_norm_at_init":
        measure = {"batches": 16, "parameter": "feed_forward.w_2.weight", **measure}
        for k in measure:
            if k not in ("batches", "parameter"):
                raise _bad(where, f"measure.{k}", "batches or parameter", k)
        if not isinstance(measure["batches"], int) or isinstance(measure["batches"], bool) or measure["batches"] < 1:
            raise _bad(where, "measure.batches", "a positive integer", measure["batches"])
        if not isinstance(measure["parameter"], str) or not measure["parameter"]:
            raise _bad(where, "measure.parameter", "a parameter name inside a layer, e.g. feed_forward.w_2.weight",
                       measure["parameter"])
        if [k for k, _ in sweep] != ["model.N"]:
            raise _bad(where, "sweep", "exactly one sweep, over N (the depth), for kind = \"grad_norm_at_init\"",
                       [k for k, _ in sweep])
    claims = data.get("claim", [])
    if not isinstance(claims, list) or not all(isinstance(c, dict) for c in claims):
        raise _bad(where, "claim", "an array of tables ([[claim]])", claims)
    for i, c in enumerate(claims):
        ctx = f"claim[{i}]"
        for req in ("text", "check"):
            if not isinstance(c.get(req), str) or not c.get(req):
                raise _bad(where, f"{ctx}.{req}", "a non-empty string", c.get(req))
        if c["check"] not in CHECKS:
            raise _bad(where, f"{ctx}.check", f"one of {', '.join(CHECKS)}", c["check"])
        for req in CHECKS[c["check"]]:
            if req not in c:
                raise ExperimentError(f"{where}: key '{ctx}.{req}' is missing (check {c['check']!r} needs "
                                      f"{', '.join(CHECKS[c['check']])})")
        if c["check"] == "verdict" and c["expected"] not in ("better", "worse", "equivalent"):
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
    exp = Experiment(name=name, path=where, description=description, variants=tuple(variants), seeds=tuple(seeds),
                     kind=kind, preset=preset, baseline=baseline, metric=metric,
                     source=_expect_str(data, "source", where), notes=_expect_str(data, "notes", where),
                     overrides=overrides, sweep=tuple(sweep), analysis=analysis, measure=measure,
                     claims=tuple(claims))
    _validate_configs(exp, where)
    return exp


def _validate_configs(exp: Experiment, where: str) -> None:
    try:
        exp.base_config()
    except HarnessError as exc:
        raise ExperimentError(f"{where}: key 'config' (on preset {exp.preset!r}): {exc}") from exc
    for key, vals in exp.sweep:
        for v in vals:
            try:
                exp.base_config().override({key: v})
            except HarnessError as exc:
                raise ExperimentError(f"{where}: key 'sweep.{key}' value {v!r}: {exc}") from exc


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def _eval_expr(expr: str, names: dict[str, int]) -> int:
    """Evaluate an integer expression of +, -, *, // over ``names`` and integer constants."""
    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and node.id in names:
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(f"unsupported element in {expr!r}")

    try:
        return int(ev(ast.parse(expr, mode="eval")))
    except SyntaxError as exc:
        raise ValueError(f"cannot parse {expr!r}") from exc


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


def spec_from_meta(meta: dict) -> Experiment | None:
    """The experiment a run was made from: stored in ``config.json``, else looked up by name."""
    if meta.get("experiment_spec"):
        return Experiment.from_meta(meta["experiment_spec"])
    if meta.get("experiment"):
        try:
            return load_experiment(find_experiment(meta["experiment"]))
        except HarnessError:
            return None
    return None


# ----------------------------------------------------------------------------- planning

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
    from .commands.common import parse_overrides
    from .runner import Plan

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
        from .runner import check_plan_size

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
    from .runner import check_plan_size

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


# ----------------------------------------------------------------------------- measurement

def measure_grad_norms(model, cfg: RunConfig, seed: int, batches: int, parameter: str, device,
                       registry=None) -> dict[str, Any]:
    """Gradient norms at initialisation of ``parameter`` in every encoder and decoder layer.

    The loss is the training loss (label-smoothed cross-entropy, ``harness.train.loss_fn``)
    on ``batches`` mini-batches of the task ``cfg.train.task`` (looked up in ``registry``, default:
    the built-ins and installed plugins) drawn from ``seed`` (the same stream the trial of
    that seed trains on); the gradient is averaged over the mini-batches (the expected
    gradient, Xiong et al. 2020 §3.4) and its Frobenius norm taken per layer.

    Returns:
        ``{"encoder": [norm per layer], "decoder": [norm per layer], "loss": mean loss}``.

    Raises:
        ExperimentError: ``parameter`` is not a parameter of the layers.
    """
    import torch

    from .tasks import get_task
    from .train import loss_fn

    tc, mc = cfg.train, cfg.model
    params = dict(model.named_parameters())
    names = {stack: [f"{stack}.layers.{i}.{parameter}" for i in range(mc.N)] for stack in ("encoder", "decoder")}
    missing = [n for ns in names.values() for n in ns if n not in params]
    if missing:
        layer = [n.split(".", 3)[3] for n in params if n.startswith("decoder.layers.0.")]
        raise ExperimentError(f"measure.parameter {parameter!r} is not a layer parameter of this variant; "
                              f"expected one of {', '.join(layer)}")
    model.train()
    model.zero_grad(set_to_none=True)
    task = get_task(tc.task, registry)
    gen = torch.Generator().manual_seed(seed)
    total = 0.0
    for _ in range(batches):
        b = task.make_batch(tc.batch, tc.seq_len, mc.vocab, gen).to(device)
        loss = loss_fn(model(b.src, b.tgt), b.tgt_y, mc.pad, tc.label_smoothing) / batches
        loss.backward()
        total += float(loss.detach())
    return {stack: [float(params[n].grad.norm()) for n in ns] for stack, ns in names.items()} | {"loss": total}


def run_grad_norm(args, plan, exp: Experiment, registry) -> int:
    """``run --experiment`` for ``kind = "grad_norm_at_init"``: measure, store, report.

    Each measurement is stored as one trial (``row``: the last/first-layer norms; ``curve``:
    one row per layer and stack) so ``report RUN`` re-renders it like any run.
    """
    from .commands.common import command_line
    from .model import build_model, unique_parameter_count
    from .runner import progress_bar
    from .store import RunStore, trial_key
    from .train import environment, resolve_device

    device = resolve_device(args.device)
    parameter = exp.measure["parameter"]
    for v in plan.variants:  # a bad measure.parameter is bad input: refuse it before a folder exists
        layers = {n.split(".", 3)[3] for n, _ in build_model(registry, v, plan.config.model, seed=0).named_parameters()
                  if n.startswith(("encoder.layers.0.", "decoder.layers.0."))}
        if parameter not in layers:
            raise ExperimentError(f"{exp.path}: key 'measure.parameter': {parameter!r} is not a layer parameter of "
                                  f"variant {v.name!r}; expected one of {', '.join(sorted(layers))}")
    meta = {
        "command": command_line(), "preset": exp.preset, "experiment": exp.name, "kind": exp.kind,
        "config": plan.config.to_dict(), "points": {n: c.to_dict() for n, c in plan.points if n},
        "variants": [v.name for v in plan.variants], "seeds": plan.seeds, "device": device.type,
        "dtype": "fp32", "environment": environment(device), **plan.meta,
    }
    store = RunStore.create(args.results_dir, meta, args.run_id)
    jobs = [(seed, point, cfg, v) for seed in plan.seeds for point, cfg in plan.points for v in plan.variants]
    if not args.quiet:
        print(f"measure {store.root}: {len(plan.variants)} variant(s) x {len(plan.seeds)} seed(s) x "
              f"{len(plan.points)} depth(s) = {len(jobs)} measurement(s) on {device.type}", file=sys.stderr)
    t0 = time.perf_counter()
    bar = progress_bar(len(jobs), "measurements", args.quiet)
    try:
        for seed, point, cfg, v in jobs:
            t1 = time.perf_counter()
            row = {"variant": v.name, **{f"slot_{k}": c for k, c in v.resolved().items()}, "seed": seed,
                   "point": point, "N": cfg.model.N}
            curve = []
            try:
                model = build_model(registry, v, cfg.model, seed=seed).to(device)
                row["params"] = unique_parameter_count(model)
                g = measure_grad_norms(model, cfg, seed, exp.measure["batches"], exp.measure["parameter"], device,
                                       registry)
                for stack in ("encoder", "decoder"):
                    s = stack[:3]
                    row[f"{s}_last"], row[f"{s}_first"] = g[stack][-1], g[stack][0]
                    row[f"{s}_last_over_first"] = g[stack][-1] / g[stack][0] if g[stack][0] > 0 else float("nan")
                    curve += [{"stack": stack, "layer": i, "grad_norm": x} for i, x in enumerate(g[stack])]
                row.update({"loss_at_init": g["loss"], "status": "ok", "reason": ""})
            except ExperimentError:
                raise
            except Exception as exc:  # noqa: BLE001 - one failed measurement must not end the run
                row.update({"status": "failed", "reason": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"})
            row["wall_s"] = time.perf_counter() - t1
            store.write_trial(trial_key(v.name, seed, point), {"row": row, "curve": curve})
            bar.update(1)
    finally:
        bar.close()
    meta["run_wall_s"] = time.perf_counter() - t0
    store.write_meta(meta)
    from .report import to_markdown, trials_frame, write_report

    report = write_report(store)
    print(to_markdown(slope_table(trials_frame(store), exp)))
    print(f"\nreport: {report}  ({meta['run_wall_s']:.1f} s)")
    return 0


#: Xiong et al. 2020 Theorem 1: exponent of L in the last layer's gradient norm at init.
THEORY_SLOPE = {"post": 0.0, "pre": -0.5}


def slope_table(df, exp: Experiment):
    """Per variant and stack: the log-log slope of the last layer's gradient norm on N."""
    import pandas as pd

    from . import stats

    rows = []
    if df.empty:
        return pd.DataFrame()
    ok = df[df["status"] == "ok"]
    for v in list(dict.fromkeys(ok["variant"])):
        g = ok[ok["variant"] == v]
        Ns = sorted(set(int(n) for n in g["N"]))
        for stack in ("decoder", "encoder"):
            col = f"{stack[:3]}_last"
            groups = [g[g["N"] == n][col].to_numpy(float) for n in Ns]
            if len(Ns) >= 2:
                s, lo, hi = stats.loglog_slope_ci(Ns, groups)
            else:
                s = lo = hi = float("nan")
            norm = g.iloc[0].get("slot_norm", "")
            theory = THEORY_SLOPE.get(norm)
            covers = "—" if theory is None or math.isnan(lo) else "yes" if lo <= theory <= hi else "no"
            rows.append({"variant": v, "stack": stack, "norm": norm,
                         f"slope of log ‖∇{exp.measure.get('parameter', 'w')}‖ on log N [95% CI]":
                             stats.fmt_ci(s, lo, hi, 3),
                         "theory (Xiong Thm 1)": "—" if theory is None else f"{theory:g}",
                         "CI contains theory": covers,
                         "N": ", ".join(map(str, Ns)), "seeds per N": int(g.groupby("N").size().min())})
    return pd.DataFrame(rows)


def write_measurement_report(store, meta: dict, df, exp: Experiment) -> Path:
    """report.md for ``kind = "grad_norm_at_init"``: norms per depth, slopes, claims, plots."""
    import pandas as pd

    from .report import environment_block, to_markdown
    from .store import atomic_write_text

    param = exp.measure.get("parameter", "feed_forward.w_2.weight")
    parts = [f"# Experiment `{exp.name}`: run `{meta.get('run_id', store.root.name)}`", "",
             "Command:", "", f"```\n{meta.get('command', '')}\n```", ""]
    parts += intro_sections(exp)
    parts += claim_sections(exp, df, [], None, exp.metric, meta)
    parts += departure_sections(exp, df, [], None, exp.metric, meta)
    parts += ["## Environment", "", environment_block(meta), ""]
    parts += ["## Config", "", f"Preset `{meta.get('preset', '')}`, depth N swept over "
              f"{[int(c['model']['N']) for c in meta.get('points', {}).values()]}; config at the first depth:", "",
              f"```json\n{json.dumps(meta.get('config', {}), indent=1)}\n```", ""]
    parts += ["## What is measured", "",
              f"At initialisation (canonical init of each seed, no optimiser step), the gradient of the training "
              f"loss (label-smoothed cross-entropy) averaged over {exp.measure.get('batches')} copy-task "
              f"mini-batches of the seed's data stream; the Frobenius norm of that expected gradient for "
              f"`{param}` in every encoder and decoder layer. Headline: the **last decoder layer** "
              f"(`decoder.layers.{{N-1}}.{param}`, the FFN weight nearest the output, Xiong et al.'s W^(2,L)); "
              f"the last encoder layer is shown too. Slope: least squares of log norm on log N over all seeds, "
              f"95 % CI by a bootstrap stratified by N (seeds resampled within each depth).", ""]
    if df.empty:
        parts += ["_no measurements_", ""]
    else:
        ok = df[df["status"] == "ok"]
        rows = []
        for v in list(dict.fromkeys(ok["variant"])):
            for n in sorted(set(int(x) for x in ok[ok["variant"] == v]["N"])):
                g = ok[(ok["variant"] == v) & (ok["N"] == n)]
                rows.append({"variant": v, "N": n, "seeds": len(g),
                             "decoder last ‖∇‖ mean ± std": _ms(g["dec_last"]),
                             "encoder last ‖∇‖ mean ± std": _ms(g["enc_last"]),
                             "decoder last/first mean ± std": _ms(g["dec_last_over_first"]),
                             "loss at init": _ms(g["loss_at_init"])})
        parts += ["## Gradient norms by depth", "", to_markdown(pd.DataFrame(rows)), ""]
        parts += ["## Log-log slopes", "", "Theory (Xiong et al. 2020, Theorem 1): post-norm slope 0 "
                  "(independent of N); pre-norm slope -0.5 (O(d sqrt(ln d / L))).", "",
                  to_markdown(slope_table(df, exp)), ""]
        bad = df[df["status"] != "ok"]
        if not bad.empty:
            parts += ["## Failures", "", to_markdown(bad[["variant", "point", "seed", "status", "reason"]]), ""]
        figs = [p for p in (plot_grad_norm_depth(ok, store.root / "grad_norm_vs_depth.png", param),
                            plot_grad_norm_layers(store, ok, store.root / "grad_norm_per_layer.png", param)) if p]
        if figs:
            parts += ["## Plots", ""] + [f"![{p.stem}]({p.name})\n" for p in figs]
    parts += [f"Measurements: {len(df)}; run wall time: {meta.get('run_wall_s', float('nan')):.1f} s.", ""]
    path = store.root / "report.md"
    atomic_write_text(path, "\n".join(parts))
    return path


def _ms(s) -> str:
    from . import stats

    m, sd = stats.mean_std(s)
    if math.isnan(m):
        return "—"
    return f"{m:.4g}" if math.isnan(sd) else f"{m:.4g} ± {sd:.2g}"


def plot_grad_norm_depth(ok, path: Path, param: str) -> Path | None:
    """log-log: last-layer gradient norm against N per variant (seeds as dots, mean line,
    fitted slope dashed), decoder and encoder side by side."""
    import numpy as np

    from . import stats
    from .report import _colors, _plt, log_axis

    if ok.empty:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    variants = list(dict.fromkeys(ok["variant"]))
    colors = _colors(len(variants))
    for ax, stack in zip(axes, ("decoder", "encoder")):
        col = f"{stack[:3]}_last"
        for v, color in zip(variants, colors):
            g = ok[ok["variant"] == v]
            Ns = sorted(set(int(n) for n in g["N"]))
            ax.scatter(g["N"] * np.exp(np.random.default_rng(0).uniform(-0.03, 0.03, len(g))), g[col],
                       s=12, color=color, alpha=0.5)
            means = [g[g["N"] == n][col].mean() for n in Ns]
            label = f"{v} ({g.iloc[0].get('slot_norm', '')}-norm)"
            if len(Ns) >= 2:
                s, lo, hi = stats.loglog_slope_ci(Ns, [g[g["N"] == n][col].to_numpy(float) for n in Ns])
                label += f": slope {s:.2f} [{lo:.2f}, {hi:.2f}]"
                x = np.array(Ns, dtype=float)
                ly = np.log(g[col].to_numpy(float)).mean() + s * (np.log(x) - np.log(g["N"].to_numpy(float)).mean())
                ax.plot(x, np.exp(ly), ls="--", color=color, lw=1)
            ax.plot(Ns, means, marker="o", color=color, lw=1.8, label=label)
            if THEORY_SLOPE.get(g.iloc[0].get("slot_norm", "")) == -0.5 and len(Ns) >= 2:
                x = np.array(Ns, dtype=float)
                ax.plot(x, means[0] * (x / x[0]) ** -0.5, ls=":", color="0.4", lw=1.2,
                        label="∝ N^-1/2 from the first pre-norm mean (Theorem 1)")
        ax.set_xscale("log")
        log_axis(ax, "y")
        Ns_all = sorted(set(int(n) for n in ok["N"]))
        ax.set_xticks(Ns_all)
        ax.set_xticklabels([str(n) for n in Ns_all])
        ax.minorticks_off()
        ax.set(xlabel="depth N (layers in encoder and in decoder)",
               ylabel=f"‖∂L/∂{param}‖_F at init (log scale)",
               title=f"Last {stack} layer: gradient norm vs depth\nseeds (dots), mean (solid), log-log fit (dashed)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_grad_norm_layers(store, ok, path: Path, param: str) -> Path | None:
    """Per-layer gradient norm profile at the depth closest to 6 (Xiong et al. Fig. 3a/b)."""
    import pandas as pd

    from .report import _colors, _plt, log_axis

    rows = [{"variant": t["row"]["variant"], "N": t["row"].get("N"), **c} for t in store.load_trials()
            if t["row"].get("status") == "ok" for c in t.get("curve", [])]
    if not rows:
        return None
    cur = pd.DataFrame(rows)
    Ns = sorted(set(int(n) for n in cur["N"]))
    n_show = min(Ns, key=lambda n: (abs(n - 6), n))
    cur = cur[cur["N"] == n_show]
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6), sharey=True)
    variants = list(dict.fromkeys(cur["variant"]))
    for ax, stack in zip(axes, ("encoder", "decoder")):
        for v, color in zip(variants, _colors(len(variants))):
            g = cur[(cur["variant"] == v) & (cur["stack"] == stack)].groupby("layer")["grad_norm"]
            med = g.median()
            ax.plot(med.index + 1, med.values, marker="o", color=color, label=v)
            ax.fill_between(med.index + 1, g.quantile(0.25), g.quantile(0.75), color=color, alpha=0.15, lw=0)
        ax.set(xlabel=f"{stack} layer (1 = nearest the input)", ylabel=f"‖∂L/∂{param}‖_F at init",
               title=f"{stack}, N = {n_show}: median over seeds, IQR band")
        log_axis(ax, "y")
        ax.set_xticks(range(1, n_show + 1))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- report sections

def intro_sections(exp: Experiment) -> list[str]:
    """Description, source, file and caveats of an experiment (markdown lines)."""
    out = ["## Experiment", "", exp.description, ""]
    if exp.source:
        out += [f"Source: {exp.source}", ""]
    out += [f"File: `{exp.path}`; kind `{exp.kind}`; variants {list(exp.variants)}; seeds {list(exp.seeds)}; "
            f"{exp.n_points} sweep point(s).", ""]
    return out


def failure_definition(exp: Experiment) -> str | None:
    """The experiment's definition of "failed to converge", in words (None when it has none)."""
    conds = [f"{m} < {t:g}" for m, t in exp.analysis.get("fail_if_below", {}).items()]
    conds += [f"{m} > {t:g}" for m, t in exp.analysis.get("fail_if_above", {}).items()]
    if not conds:
        return None
    return ("a run **failed to converge** when it diverged (non-finite loss or gradient norm) or, at the end "
            "of training, " + " or ".join(conds) + " (a missing value counts as failed)")


def failed_mask(df, exp: Experiment):
    """Boolean Series over ``df``: failed to converge (see :func:`failure_definition`)."""
    import pandas as pd

    failed = df["status"] != "ok"
    for m, t in exp.analysis.get("fail_if_below", {}).items():
        v = pd.to_numeric(df.get(m), errors="coerce")
        failed |= ~(v >= t)
    for m, t in exp.analysis.get("fail_if_above", {}).items():
        v = pd.to_numeric(df.get(m), errors="coerce")
        failed |= ~(v <= t)
    return failed


def failure_frame(df, exp: Experiment, meta: dict):
    """Per (variant, point) failure counts and converged-only quality, plus a pooled row per variant."""
    import pandas as pd

    from . import stats
    from .report import point_order, resolve_baseline, variant_order

    ran = df[df["status"] != "failed"].copy()
    ran["_failed"] = failed_mask(ran, exp)
    baseline = resolve_baseline(df, meta, exp.baseline)
    rows = []
    for point in point_order(ran, meta) + ["(all points)"]:
        for v in variant_order(ran, baseline, meta):
            g = ran[ran["variant"] == v] if point == "(all points)" else ran[(ran["variant"] == v) & (ran["point"] == point)]
            if g.empty:
                continue
            k, n = int(g["_failed"].sum()), len(g)
            lo, hi = stats.wilson_interval(k, n)
            conv = g[~g["_failed"]]
            rows.append({"point": point, "variant": v,
                         "failed x/n [Wilson 95%]": f"{k}/{n} [{lo:.2f}, {hi:.2f}]",
                         "diverged": int((g["status"] == "diverged").sum()),
                         "converged": len(conv),
                         "converged: held-out CE IQM [95% CI]": stats.fmt_ci(*stats.iqm_ci(conv["heldout_ce"].to_numpy(float))),
                         "converged: exact-match IQM [95% CI]": stats.fmt_ci(*stats.iqm_ci(conv["exact_match"].to_numpy(float))),
                         "_k": k, "_n": n, "_lo": lo, "_hi": hi})
    return pd.DataFrame(rows)


def plot_failures(ff, path: Path, definition: str) -> Path | None:
    """Failure rate per sweep point and variant with Wilson 95 % bars."""
    import numpy as np

    from .report import _colors, _plt

    ff = ff[ff["point"] != "(all points)"]
    if ff.empty:
        return None
    plt = _plt()
    points = list(dict.fromkeys(ff["point"]))
    variants = list(dict.fromkeys(ff["variant"]))
    fig, ax = plt.subplots(figsize=(max(6.5, 1.6 * len(points) + 3), 4.6))
    width = 0.7 / max(1, len(variants))
    for j, (v, color) in enumerate(zip(variants, _colors(len(variants)))):
        g = ff[ff["variant"] == v].set_index("point").reindex(points)
        x = np.arange(len(points)) + (j - (len(variants) - 1) / 2) * width
        rate = g["_k"] / g["_n"]
        ax.bar(x, rate, width=width * 0.9, color=color, alpha=0.75, label=v)
        ax.errorbar(x, rate, yerr=[rate - g["_lo"], g["_hi"] - rate], fmt="none", ecolor="black", capsize=4, lw=1.2)
        for xi, k, n in zip(x, g["_k"], g["_n"]):
            if not np.isnan(n):
                ax.text(xi, 1.05, f"{int(k)}/{int(n)}", ha="center", fontsize=8)
    ax.set_xticks(range(len(points)))
    ax.set_xticklabels([p or "(no sweep)" for p in points])
    ax.set_ylim(0, 1.25)
    ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    ax.set_ylabel("fraction of seeds that failed to converge")
    ax.set_title("Failure rate with Wilson 95 % intervals\n" + definition.replace("**", ""), fontsize=9, wrap=True)
    ax.legend(fontsize=9, loc="upper center", ncol=len(variants), frameon=False)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def result_sections(store, exp: Experiment, df, rows, baseline, metric, meta) -> list[str]:
    """Experiment-specific sections after the main table (failure analysis)."""
    from .report import to_markdown

    out: list[str] = []
    definition = failure_definition(exp)
    if definition and len(df):
        ff = failure_frame(df, exp, meta)
        out += ["## Convergence", "", f"Definition: {definition}. Failure rates are x/n with a Wilson 95 % "
                "interval; quality is reported separately over the runs that converged (Nguyen & Salazar 2019 "
                "and Liu et al. 2020 disagree on its sign, so it is shown, not judged).", "",
                to_markdown(ff[[c for c in ff.columns if not c.startswith("_")]]), ""]
        png = plot_failures(ff, store.root / "failure_rate.png", definition)
        if png:
            out += [f"![failure rate]({png.name})", ""]
    return out


def claim_sections(exp: Experiment, df, rows, baseline, metric, meta) -> list[str]:
    """"Claims checked": one line per ``[[claim]]`` with its status and evidence."""
    if not exp.claims:
        return []
    out = ["## Claims checked", "",
           "Each published claim is checked against this run's data; **not reproduced** and **inconclusive** "
           "are stated as such, never softened.", ""]
    for c in exp.claims:
        try:
            status, evidence = evaluate_claim(c, exp, df, rows, baseline, metric, meta)
        except (KeyError, ValueError) as exc:
            status, evidence = "inconclusive", f"cannot evaluate: {exc}"
        src = f" ({c['source']})" if c.get("source") else ""
        out.append(f"- **{status}**: {c['text']}{src}. {evidence}")
    return out + [""]


def departures(exp: Experiment, df, rows, baseline, metric, meta) -> list[str]:
    """Data-driven statements of where this run departs from the paper's picture (plain sentences)."""
    from . import stats

    out: list[str] = []
    if df is None or len(df) == 0:
        return out
    for c in exp.claims:
        try:
            status, _ = evaluate_claim(c, exp, df, rows, baseline, metric, meta)
        except (KeyError, ValueError):
            continue
        if status != "reproduced":
            out.append(f"The claim \"{c['text']}\" is **{status}** here (numbers under Claims checked).")
    if exp.kind == "grad_norm_at_init":
        ok = df[df["status"] == "ok"]
        for v in dict.fromkeys(ok["variant"]):
            g = ok[ok["variant"] == v]
            theory = THEORY_SLOPE.get(g.iloc[0].get("slot_norm", ""))
            Ns = sorted(set(int(n) for n in g["N"]))
            if theory is None or len(Ns) < 2:
                continue
            for stack in ("decoder", "encoder"):
                sl, lo, hi = stats.loglog_slope_ci(Ns, [g[g["N"] == n][f"{stack[:3]}_last"].to_numpy(float) for n in Ns])
                if not math.isnan(lo) and not lo <= theory <= hi:
                    how = ("shrinks more slowly with N than" if theory < 0 and sl > theory else
                           "shrinks faster with N than" if sl < theory else "grows with N, unlike")
                    out.append(f"{v} ({g.iloc[0].get('slot_norm')}-norm), last {stack} layer: slope {sl:.2f} "
                               f"[95% CI {lo:.2f}, {hi:.2f}] excludes the theoretical {theory:g}; the gradient norm "
                               f"{how} Theorem 1 predicts.")
        return out
    ran = df[df["status"] != "failed"]
    if exp.analysis and len(ran):
        failed = failed_mask(ran, exp)
        n_div = int((ran["status"] == "diverged").sum())
        if failed.any() and n_div == 0:
            out.append(f"No run diverged (no non-finite loss or gradient norm): all {int(failed.sum())} runs counted "
                       f"as failed to converge ended below the threshold at the end of the budget, a plateau or a "
                       f"run too slow for {meta.get('config', {}).get('train', {}).get('steps')} steps; this "
                       f"miniature does not tell the two apart.")
        for c in exp.claims:
            if c["check"] != "failure_rate_greater":
                continue
            for point in dict.fromkeys(ran["point"]):
                g = ran[(ran["variant"] == c["b"]) & (ran["point"] == point)]
                k = int(failed_mask(g, exp).sum()) if len(g) else 0
                if len(g) and k / len(g) >= 0.5:
                    where = f" at {point}" if point else ""
                    out.append(f"{c['b']} also failed to converge{where} ({k}/{len(g)} seeds): its advantage over "
                               f"{c['a']} does not hold there.")
    if rows and all(r["solved"] == 0 for r in rows):
        steps = meta.get("config", {}).get("train", {}).get("steps")
        out.append(f"No run reached held-out exact-match >= 0.99 within {steps} steps, so quality is compared "
                   f"before the task is solved.")
    return out


def departure_sections(exp: Experiment, df, rows, baseline, metric, meta) -> list[str]:
    """"Where this miniature departs from the paper": :func:`departures` plus the file's notes."""
    items = departures(exp, df, rows, baseline, metric, meta)
    out = ["## Where this miniature departs from the paper", ""]
    if items:
        out += [f"- {t}" for t in items]
    else:
        out.append("- The automatic checks found no departure in the measured quantities.")
    if exp.notes:
        out.append("- Setup notes from the experiment file: " + exp.notes)
    return out + [""]


def evaluate_claim(c: dict, exp: Experiment, df, rows, baseline, metric, meta) -> tuple[str, str]:
    """(status, evidence) for one claim; status is reproduced / not reproduced / inconclusive."""
    import numpy as np

    from . import stats

    if df is None or len(df) == 0:
        return "inconclusive", "no data"
    check = c["check"]
    if check == "params_difference":
        pa = df[df["variant"] == c["a"]]["params"].dropna()
        pb = df[df["variant"] == c["b"]]["params"].dropna()
        if pa.empty or pb.empty:
            return "inconclusive", f"{c['a']} or {c['b']} has no parameter count in this run"
        cfg = meta.get("config", {}).get("model", {})
        expected = _eval_expr(str(c["expected"]), {k: cfg[k] for k in MODEL_FIELDS if k in cfg})
        got = int(pa.iloc[0]) - int(pb.iloc[0])
        ok = got == expected
        return ("reproduced" if ok else "not reproduced",
                f"params({c['a']}) - params({c['b']}) = {int(pa.iloc[0])} - {int(pb.iloc[0])} = {got}; "
                f"expected {c['expected']} = {expected} (V={cfg.get('vocab')}, d_model={cfg.get('d_model')}).")
    if check == "verdict":
        want = c["expected"]
        invalid = [r for r in rows if r["variant"] in (c["variant"], baseline) and r.get("invalid")]
        if invalid:
            return "inconclusive", (f"{invalid[0]['variant']} is invalid (it failed an integrity probe: "
                                    f"{invalid[0]['invalid'][0]}); no verdict is drawn from it")
        found = [r for r in rows if r["variant"] == c["variant"] and r["comparison"] is not None
                 and (c.get("point") is None or r["point"] == c.get("point"))]
        if not found:
            return "inconclusive", f"no paired comparison of {c['variant']} with {baseline} in this run"
        parts, statuses = [], []
        for r in found:
            cmp_ = r["comparison"]
            where = f" at {r['point']}" if r["point"] else ""
            parts.append(f"P({c['variant']} > {baseline}){where} on {metric} = "
                         f"{stats.fmt_ci(cmp_.p, cmp_.low, cmp_.high, 2)} (Wilson 95%) over {cmp_.n_pairs} paired seeds -> "
                         f"{cmp_.label()}")
            statuses.append("reproduced" if cmp_.verdict == want else
                            "inconclusive" if cmp_.verdict == "no claim" else "not reproduced")
        status = ("not reproduced" if "not reproduced" in statuses else
                  "reproduced" if all(s == "reproduced" for s in statuses) else "inconclusive")
        return status, "; ".join(parts) + f" (expected: {want})."
    if check == "failure_rate_greater":
        ran = df[df["status"] != "failed"].copy()
        ran["_failed"] = failed_mask(ran, exp)
        from .report import point_order

        pts = point_order(ran, meta)
        ga = [ran[(ran["variant"] == c["a"]) & (ran["point"] == p)]["_failed"].to_numpy(bool) for p in pts]
        gb = [ran[(ran["variant"] == c["b"]) & (ran["point"] == p)]["_failed"].to_numpy(bool) for p in pts]
        if not any(len(g) for g in ga) or not any(len(g) for g in gb):
            return "inconclusive", f"{c['a']} or {c['b']} has no runs"
        keep = [i for i in range(len(pts)) if len(ga[i]) and len(gb[i])]
        ga, gb, pts = [ga[i] for i in keep], [gb[i] for i in keep], [pts[i] for i in keep]
        d, lo, hi = stats.rate_difference_ci(ga, gb)
        ka, na = int(sum(g.sum() for g in ga)), sum(len(g) for g in ga)
        kb, nb = int(sum(g.sum() for g in gb)), sum(len(g) for g in gb)
        per = "; ".join(f"{p or 'all'}: {int(a.sum())}/{len(a)} vs {int(b.sum())}/{len(b)}" for p, a, b in zip(pts, ga, gb))
        if math.isnan(lo):
            status = "inconclusive"
        else:  # significant in the predicted direction / no effect or the opposite one / a CI covering 0
            status = "reproduced" if lo > 0 else "not reproduced" if d <= 0 else "inconclusive"
        return status, (f"failed to converge: {c['a']} {ka}/{na}, {c['b']} {kb}/{nb}; pooled difference "
                        f"{d:+.2f} [95% CI {lo:+.2f}, {hi:+.2f}] (Newcombe hybrid score interval); per point: {per}.")
    if check == "slope":
        stack = c.get("stack", "decoder")
        col = f"{stack[:3]}_last"
        g = df[(df["variant"] == c["variant"]) & (df["status"] == "ok")]
        if g.empty or col not in g:
            return "inconclusive", f"no measurements of {c['variant']}"
        Ns = sorted(set(int(n) for n in g["N"]))
        s, lo, hi = stats.loglog_slope_ci(Ns, [g[g["N"] == n][col].to_numpy(float) for n in Ns])
        a, b = c["within"]
        status = ("reproduced" if a <= lo and hi <= b else
                  "not reproduced" if hi < a or lo > b else "inconclusive")
        return status, (f"{stack} last-layer slope for {c['variant']} = {s:.3f} [95% CI {lo:.3f}, {hi:.3f}] over "
                        f"N = {Ns}; predicted range [{a}, {b}].")
    if check == "ratio_greater":
        n = int(c["N"])
        ga = df[(df["variant"] == c["a"]) & (df["N"] == n) & (df["status"] == "ok")].set_index("seed")["dec_last_over_first"]
        gb = df[(df["variant"] == c["b"]) & (df["N"] == n) & (df["status"] == "ok")].set_index("seed")["dec_last_over_first"]
        seeds = sorted(set(ga.index) & set(gb.index))
        if not seeds:
            return "inconclusive", f"no paired measurements at N = {n}"
        wins = int(np.sum(ga.loc[seeds].to_numpy(float) > gb.loc[seeds].to_numpy(float)))
        frac = wins / len(seeds)
        status = "reproduced" if frac >= float(c["min_fraction"]) else "not reproduced"
        return status, (f"decoder last/first-layer gradient ratio at N = {n}: {c['a']} > {c['b']} in {wins}/{len(seeds)} "
                        f"paired seeds (needed >= {float(c['min_fraction']):.0%}); medians {ga.median():.3g} vs "
                        f"{gb.median():.3g}.")
    raise ValueError(f"unknown check {check!r}")
