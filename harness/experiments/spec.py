"""The parsed form of an experiment file (:class:`Experiment`), its error type and the small
validation helpers the parser and the planner share (config keys, expressions)."""
from __future__ import annotations

import ast
import dataclasses
import itertools
import math
import operator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import ModelConfig, RunConfig, TaskConfig, TrainConfig, get_preset
from ..errors import ConfigError, HarnessError

REPO_ROOT = Path(__file__).resolve().parents[2]
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
    "sensitivity_lower": ("a", "b"),
    "tuned_verdict": ("variant", "expected"),
}
MODEL_FIELDS = {f.name for f in dataclasses.fields(ModelConfig)}
TRAIN_FIELDS = {f.name for f in dataclasses.fields(TrainConfig)}
TASK_FIELDS = {f.name for f in dataclasses.fields(TaskConfig)}


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
    metric: str = ""
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
    """``lr`` -> ``train.lr``, ``N`` -> ``model.N``; dotted keys (``model.``, ``train.``, ``task.``) are checked."""
    section, dot, name = key.partition(".")
    if dot:
        known = {"model": MODEL_FIELDS, "train": TRAIN_FIELDS, "task": TASK_FIELDS}.get(section)
        if known is None:
            raise _bad(where, f"{ctx}.{key}", "a key under model., train. or task.", key)
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

