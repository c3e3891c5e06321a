"""A suite file (``experiments/suites/NAME.toml``) parsed and validated: :class:`SuiteSpec`,
:func:`load_suite` (the keys: :mod:`harness.suite`)."""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError
from ..metrics import BUILTIN

SUITES_DIR = Path(__file__).resolve().parent.parent.parent / "experiments" / "suites"
#: name -> higher is better: the built-in tasks' metrics shown in ``suite`` (:attr:`harness.metrics.Metric.show`).
SUITE_METRICS = {m.name: m.higher_is_better for m in BUILTIN.values() if "suite" in m.show and m.verdict}


@dataclass
class SuiteSpec:
    """A parsed suite file. ``variants`` are names/globs as for ``--variants``."""

    name: str
    preset: str
    tasks: list[str]
    variants: list[str]
    seeds: int
    reference: str
    metric: str = "heldout_ce"
    overrides: list[str] = field(default_factory=list)
    description: str = ""
    path: str = ""
    #: peak learning rates every task sweeps (``run --lr-grid``); verdicts are then the tuned ones
    lr_grid: list[float] = field(default_factory=list)


def _bad(path: Path, key: str, expected: str, got) -> ConfigError:
    return ConfigError(f"suite file {path}: {key} must be {expected}, got {got!r}")


def _str_list(path: Path, d: dict, key: str, default=None) -> list[str]:
    value = d.get(key, default)
    if not isinstance(value, list) or not all(isinstance(x, str) and x for x in value) or (
            default is None and not value):
        raise _bad(path, key, "a non-empty list of strings" if default is None else "a list of strings", value)
    return list(value)


def suite_path(name: str) -> Path:
    """``experiments/suites/NAME.toml``, or NAME itself when it is a path to a .toml file.

    Raises:
        ConfigError: no such file (the message lists the suites that exist).
    """
    p = Path(name) if name.endswith(".toml") or "/" in name else SUITES_DIR / f"{name}.toml"
    if not p.is_file():
        known = ", ".join(sorted(q.stem for q in SUITES_DIR.glob("*.toml"))) or "none"
        raise ConfigError(f"suite {name!r} not found ({p}); suites: {known}")
    return p


def load_suite(name: str = "default") -> SuiteSpec:
    """Parse and validate a suite file (see :mod:`harness.suite` for the keys).

    Raises:
        ConfigError: missing file, not UTF-8 TOML, unknown key, a value of the wrong type, seeds
            outside 1..1000, an unknown metric.
    """
    path = suite_path(name)
    try:
        d = tomllib.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"suite file {path} is not valid UTF-8 TOML: {str(exc) or type(exc).__name__}") from None
    known = {"description", "preset", "tasks", "variants", "seeds", "reference", "metric", "set", "lr_grid"}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ConfigError(f"suite file {path}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    seeds = d.get("seeds")
    if not isinstance(seeds, int) or isinstance(seeds, bool) or not 1 <= seeds <= 1000:
        raise _bad(path, "seeds", "an integer in 1..1000", seeds)
    metric = d.get("metric", "heldout_ce")
    if metric not in SUITE_METRICS:
        raise _bad(path, "metric", f"one of {', '.join(SUITE_METRICS)}", metric)
    grid = d.get("lr_grid", [])
    if not isinstance(grid, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0
                                             for x in grid):
        raise _bad(path, "lr_grid", "a list of positive learning rates", grid)
    for key in ("preset", "reference"):
        if not isinstance(d.get(key), str) or not d[key]:
            raise _bad(path, key, "a non-empty string", d.get(key))
    return SuiteSpec(name=path.stem, preset=d["preset"], tasks=_str_list(path, d, "tasks"),
                     variants=_str_list(path, d, "variants"), seeds=seeds, reference=d["reference"],
                     metric=metric, overrides=_str_list(path, d, "set", []),
                     description=str(d.get("description", "")), path=str(path), lr_grid=[float(x) for x in grid])
