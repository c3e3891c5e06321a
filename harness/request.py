"""A run as one typed request: what ``python -m harness run``, :func:`harness.run` and the suite
all build, and :mod:`harness.launch` starts or resumes.

The command line is parsed into a :class:`RunRequest` (``harness.commands.run``), the Python
API builds one from keyword arguments (:mod:`harness.api`), the suite builds one per task
(:mod:`harness.suite`); nothing below ``harness/commands/`` sees the parsed command line.

An option left ``None`` was not given: the launch fills the documented default, and
``run --resume`` takes the stored run's value for it (:meth:`RunRequest.given`).
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from .config import DEFAULT_PRESET
from .errors import ConfigError
from .plugins import PluginSpec
from .runner import check_plan_size
from .runmeta import Execution, RunMeta
from .store import RunStore

#: Defaults of the options that ``--resume`` must tell apart from "not given". name -> default.
PLAN_DEFAULTS = {"variants": ("all",), "preset": DEFAULT_PRESET, "seeds": 1, "seed_start": 0}
DEVICE_DEFAULTS = {"device": "auto", "dtype": "fp32"}
EXEC_DEFAULTS = {"executor": "local", "jobs": "auto", "vectorise_seeds": "auto", "capture": "auto"}
#: Options that change the trained config, and options that change which trials a run holds.
CONFIG_OPTIONS = frozenset({"preset", "overrides", "experiment", "lr_grid"})
TRIAL_OPTIONS = frozenset({"variants", "grid", "seeds", "seed_start", "experiment"})
DTYPES = ("fp32", "bf16")


def override_items(overrides: Mapping[str, Any] | Iterable[str] | None) -> tuple[str, ...]:
    """``{"train.steps": 50}`` or ``["train.steps=50"]`` -> ``("train.steps=50",)``: the ``--set``
    items a run records (values as Python literals, read back by :func:`harness.settings.parse_overrides`).

    Raises:
        ConfigError: an item that is not a string.
    """
    if overrides is None:
        return ()
    if isinstance(overrides, Mapping):
        return tuple(f"{k}={v!r}" for k, v in overrides.items())
    items = [overrides] if isinstance(overrides, str) else list(overrides)
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(f"overrides must be a dict or KEY=VALUE strings, got {item!r}")
    return tuple(items)


def check_dtype(dtype: str) -> None:
    """Raises ConfigError unless ``dtype`` is one of :data:`DTYPES`."""
    if dtype not in DTYPES:
        raise ConfigError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")


def split_patterns(items: Iterable[str]) -> list[str]:
    """``--variants`` items (names and globs, space- or comma-separated) as single patterns:
    ``["baseline,pre_*", "seed_001"]`` -> ``["baseline", "pre_*", "seed_001"]``."""
    return [p for item in items for p in item.replace(",", " ").split()]


def names(value: str | Iterable[str] | None) -> tuple[str, ...] | None:
    """A name or names (``"all"``, ``["baseline", "pre_*"]``) as a tuple; None stays None."""
    if value is None:
        return None
    return (value,) if isinstance(value, str) else tuple(str(v) for v in value)


@dataclass(frozen=True)
class RunRequest:
    """Everything a run needs. ``None`` = not given (see the module docstring).

    Args:
        variants: ``all``, names and shell-style globs (``--variants``); ``grid``: the full factorial.
        preset: ``quick`` (default), ``paper``, ``suite``, ``deep`` or ``tiny``.
        overrides: ``--set`` items ``"KEY=VALUE"`` (``--task NAME`` is ``train.task='NAME'``).
        seeds, seed_start: seeds ``seed_start .. seed_start + seeds - 1`` per variant.
        experiment: an experiment file's name (``experiments/NAME.toml``) or path.
        check: record check's equivalence classes before training.
        device, dtype: ``auto``/``cpu``/``cuda``; ``fp32``/``bf16``.
        executor, jobs, threads, address, vectorise_seeds: how trials execute
            (:class:`harness.runmeta.Execution`; ``vectorise_seeds``: ``auto``, ``on`` or ``off``).
        capture: ``--capture``: ``auto``, ``on`` (CUDA only) or ``off`` (:class:`harness.runmeta.Execution`).
        plugins: plugin modules and files to load (:class:`harness.plugins.PluginSpec`).
        results_dir, run_id: the run folder ``results_dir/run_id`` (default id: a timestamp).
        quiet: no progress bars or log lines on stderr.
        resume: a stored run's folder: run only its missing trials (``--resume``).
        retry_failed: with ``resume``, run its failed and diverged trials again (``--retry-failed``).
        allow_code_change: with ``resume``, go on when the project's code or a plugin file differs from
            the code that trained the run (``--allow-code-change``; recorded, :mod:`harness.provenance`).
        command: the command line shown in reports (default: the equivalent ``python -m harness run``).
        tensorboard: write each trial's curves and final metrics as TensorBoard events
            (:mod:`harness.tboard`): ``""`` under the run folder's ``tensorboard/``, a folder ``DIR``
            under ``DIR/<run id>/``; None: none. Written live by the processes that train (:mod:`harness.track`).
        mlflow: log each trial to MLflow as it trains (:mod:`harness.track`): ``""`` a local file store
            ``file:<run folder>/mlruns``, else the tracking URI; None: none.
        save_models: keep each trial's final weights as ``models/<key>.pt`` (:mod:`harness.saved`).
        trial_timeout: ``--trial-timeout`` seconds per trial (or vectorised group), time_budget:
            ``--time-budget`` seconds for this invocation; None: no limit. Each invocation sets its own
            (a resume does not inherit them): see :mod:`harness.executors.limits`.
        baseline: the variant the others are compared with (``--baseline``; None: the variant named
            ``baseline``, an experiment's own; :func:`harness.report.choose_baseline`).
        keep_checkpoints: keep each trial's mid-trial checkpoint (``checkpoints/<key>.pt``,
            :mod:`harness.checkpoint`) after the trial is stored, instead of removing it.
        lr_grid: ``--lr-grid``: peak learning rates (``train.lr``) to sweep, every variant x learning rate x
            seed; the report chooses each variant's on dev and gives the tuned verdict
            (:mod:`harness.report.tuning`). None: no sweep.
    """

    variants: tuple[str, ...] | None = None
    grid: bool = False
    preset: str | None = None
    overrides: tuple[str, ...] = ()
    seeds: int | None = None
    seed_start: int | None = None
    experiment: str | None = None
    check: bool = True
    device: str | None = None
    dtype: str | None = None
    executor: str | None = None
    jobs: int | str | None = None
    threads: int | None = None
    address: str | None = None
    vectorise_seeds: str | None = None
    capture: str | None = None
    plugins: PluginSpec = field(default_factory=PluginSpec)
    results_dir: str = "results"
    run_id: str | None = None
    quiet: bool = False
    resume: str | None = None
    retry_failed: bool = False
    allow_code_change: bool = False
    command: str | None = None
    tensorboard: str | None = None
    save_models: bool = False
    mlflow: str | None = None
    trial_timeout: float | None = None
    time_budget: float | None = None
    baseline: str | None = None
    keep_checkpoints: bool = False
    lr_grid: tuple[float, ...] | None = None

    def given(self) -> set[str]:
        """Names of the options given (not left to their defaults)."""
        out = {n for n in (*PLAN_DEFAULTS, *DEVICE_DEFAULTS, *EXEC_DEFAULTS, "threads", "address", "experiment")
               if getattr(self, n) is not None}
        if self.grid:
            out.add("grid")
        if self.overrides:
            out.add("overrides")
        if self.lr_grid is not None:
            out.add("lr_grid")
        if self.plugins.modules or self.plugins.files or self.plugins.strict:
            out.add("plugins")
        return out

    def validate(self) -> "RunRequest":
        """Checks that need no registry: types, ranges, option combinations.

        Raises:
            ConfigError: naming the option (as the command line spells it) and the value.
        """
        for name in ("seeds", "seed_start", "threads"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise ConfigError(f"{_flag(name)} must be an integer, got {value!r}")
        if self.dtype is not None:
            check_dtype(self.dtype)
        if self.results_dir == "" or self.results_dir is None:
            raise ConfigError("--results-dir must not be empty (give a folder, e.g. --results-dir results)")
        if self.run_id is not None:
            from .store import check_name

            check_name(self.run_id)
        if self.resume is not None and self.run_id:
            raise ConfigError("--run-id cannot be combined with --resume (a resumed run keeps its folder)")
        if self.retry_failed and self.resume is None:
            raise ConfigError("--retry-failed needs --resume RUN_DIR (it re-runs a stored run's failed trials)")
        if self.allow_code_change and self.resume is None:
            raise ConfigError("--allow-code-change needs --resume RUN_DIR (a new run records the code it runs)")
        return self

    def execution(self) -> Execution:
        """``executor/jobs/threads/address`` validated (defaults filled).

        Raises:
            ConfigError / UnknownNameError: a bad value.
        """
        return Execution(EXEC_DEFAULTS["executor"] if self.executor is None else self.executor,
                         EXEC_DEFAULTS["jobs"] if self.jobs is None else self.jobs,
                         self.threads, self.address,
                         EXEC_DEFAULTS["vectorise_seeds"] if self.vectorise_seeds is None
                         else self.vectorise_seeds,
                         EXEC_DEFAULTS["capture"] if self.capture is None else self.capture,
                         self.trial_timeout, self.time_budget).validate()

    def seed_list(self, n_variants: int = 1) -> list[int]:
        """``[seed_start, ..., seed_start + seeds - 1]`` (defaults filled), refused before it is built
        when ``n_variants`` x seeds is more than a run may plan (:func:`harness.runner.check_plan_size`).

        Raises:
            ConfigError: ``seeds < 1``, ``seed_start < 0`` or too many trials.
        """
        seeds = PLAN_DEFAULTS["seeds"] if self.seeds is None else self.seeds
        start = PLAN_DEFAULTS["seed_start"] if self.seed_start is None else self.seed_start
        if seeds < 1:
            raise ConfigError(f"--seeds must be >= 1, got {seeds}")
        if start < 0:
            raise ConfigError(f"--seed-start must be >= 0, got {start}")
        check_plan_size(n_variants, seeds)
        return list(range(start, start + seeds))

    def patterns(self) -> list[str]:
        """``--variants`` items split at commas and spaces (``["all"]`` when not given)."""
        return split_patterns(self.variants if self.variants is not None else PLAN_DEFAULTS["variants"])

    def command_line(self) -> str:
        """The command as the user typed it (``command``), else the equivalent command line."""
        if self.command:
            return self.command
        words = ["run"]
        if self.resume is not None:
            words += ["--resume", str(self.resume)] + (["--retry-failed"] if self.retry_failed else [])
            words += ["--allow-code-change"] * self.allow_code_change
        if self.variants is not None:
            words += ["--variants", *self.variants]
        words += ["--grid"] * self.grid
        for name in ("experiment", "baseline", "preset", "seeds", "seed_start", "device", "dtype", "executor", "jobs",
                     "threads", "address", "vectorise_seeds", "capture", "trial_timeout", "time_budget", "run_id"):
            if getattr(self, name) is not None:
                words += [_flag(name), str(getattr(self, name))]
        words += [w for item in self.overrides for w in ("--set", item)]
        words += [] if self.lr_grid is None else ["--lr-grid", ",".join(f"{v:g}" for v in self.lr_grid)]
        if self.results_dir != "results":
            words += ["--results-dir", str(self.results_dir)]
        words += ["--no-check"] * (not self.check) + ["-q"] * self.quiet + ["--save-models"] * self.save_models
        words += ["--keep-checkpoints"] * self.keep_checkpoints
        words += [] if self.tensorboard is None else ["--tensorboard", *([self.tensorboard] if self.tensorboard else [])]
        words += [] if self.mlflow is None else ["--mlflow", *([self.mlflow] if self.mlflow else [])]
        words = [w for m in self.plugins.modules for w in ("-p", m)] + \
                [w for f in self.plugins.files for w in ("--plugin", str(f))] + words
        return "python -m harness " + shlex.join(words)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class CheckRequest:
    """What ``python -m harness check`` / :func:`harness.check` checks (see docs/checks.md).

    Args:
        variants: ``all``, names and globs. preset, overrides: the model config (default: the check
            config; overrides only ``model.*`` items ``"KEY=VALUE"``).
        device, dtype, seed: where and how the comparisons run.
        equivalent: ``"SLOT=A,B"`` items (``--equivalent``). all_components: every registered component.
        plugins: plugin modules and files. quiet: no progress lines.
        results_dir, run_id: the record goes to ``<results_dir>/checks/<run_id>/`` (default id
            ``check-<timestamp>``).
        command: the command line shown in the record (default: the equivalent ``python -m harness check``).
        threads: torch intra-op threads while checking (default 1: the check's tensors are probe-sized,
            and more threads than free cores make it 10-100x slower on a busy machine); None keeps
            torch's setting. Restored afterwards.
    """

    variants: tuple[str, ...] = ("all",)
    grid: bool = False
    preset: str | None = None
    overrides: tuple[str, ...] = ()
    device: str = "auto"
    dtype: str = "fp32"
    seed: int = 0
    equivalent: tuple[str, ...] = ()
    all_components: bool = False
    plugins: PluginSpec = field(default_factory=PluginSpec)
    quiet: bool = True
    results_dir: str | Path = "results"
    run_id: str | None = None
    command: str | None = None
    threads: int | None = 1

    def patterns(self) -> list[str]:
        """``variants`` split at commas and spaces."""
        return split_patterns(self.variants)

    def command_line(self) -> str:
        """The command as the user typed it (``command``), else the equivalent command line."""
        if self.command:
            return self.command
        words = ["check", "--variants", *self.variants] + ["--grid"] * self.grid
        words += ["--preset", self.preset] if self.preset else []
        words += [w for item in self.overrides for w in ("--set", item)]
        words += ["--device", self.device, "--dtype", self.dtype, "--seed", str(self.seed)]
        words += [w for item in self.equivalent for w in ("--equivalent", item)]
        words += ["--all-components"] * self.all_components
        words += ["--run-id", self.run_id] if self.run_id is not None else []
        words += ["--results-dir", str(self.results_dir)] if str(self.results_dir) != "results" else []
        words = [w for m in self.plugins.modules for w in ("-p", m)] + \
                [w for f in self.plugins.files for w in ("--plugin", str(f))] + words + ["-q"] * self.quiet
        return "python -m harness " + shlex.join(words)


@dataclass
class CheckOutcome:
    """What a check left: its report and its record (``<results_dir>/checks/<run-id>/``).

    Attributes:
        report: the :class:`harness.checks.CheckReport` (``.ok``, ``.classes()``, the pairs, probes
            and references). store: the record's folder. meta: its ``config.json``.
        variants: the variants checked. config: the model config (:class:`harness.ModelConfig`).
        groups: the equivalence groups used (``{slot: [set of components]}``).
    """

    report: Any
    store: RunStore
    meta: RunMeta
    variants: list
    config: Any
    groups: dict

    @property
    def ok(self) -> bool:
        """Every result matches its declaration (the command's exit status 0)."""
        return bool(self.report.ok)

    @property
    def csv(self) -> Path:
        """``checks.csv``: one row per result."""
        return self.store.root / "checks.csv"

    @property
    def markdown(self) -> Path:
        """``checks.md``: the record as markdown."""
        return self.store.root / "checks.md"

    @property
    def exit_code(self) -> int:
        """0 every result matches its declaration, 1 one does not."""
        return 0 if self.ok else 1


@dataclass
class RunOutcome:
    """What a started or resumed run left: its store, metadata and report, and how it ended.

    Attributes:
        store: the run folder. meta: its ``config.json`` as written last.
        report: report.md's path (None when an interrupt came before it was written).
        interrupted: the interrupt that stopped the run (:class:`Terminated` for SIGTERM), or None.
        total: trials planned. table: a table to show instead of the report's main table (measurements).
    """

    store: RunStore
    meta: RunMeta
    report: Path | None
    interrupted: KeyboardInterrupt | None
    total: int
    table: Any = None

    def done(self) -> int:
        """Planned trials stored so far."""
        planned = self.meta.planned_keys()
        done = self.store.done_keys()
        return len(done & set(planned)) if planned else len(done)

    def bad_rows(self) -> list[dict]:
        """Rows (trials.csv's) of the stored trials whose status is not ``ok``."""
        return [t.row for t in self.store.load_trials() if t.status != "ok"]

    @property
    def exit_code(self) -> int:
        """0 every trial ok, 1 one is not (failed, diverged, timed out, invalid) or the time budget was
        spent before every trial ran (status ``out_of_time``), 130 interrupted."""
        if self.interrupted is not None:
            return 130
        return 1 if self.bad_rows() or self.meta.status == "out_of_time" else 0


class Terminated(KeyboardInterrupt):
    """SIGTERM, turned into an interrupt so the run stops as cleanly as on Ctrl-C."""
