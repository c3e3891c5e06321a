"""Python API: the command line's ``run``, ``check`` and reports as functions, and the model alone.

Re-exported lazily from :mod:`harness` (``harness.run``, ``harness.check``, ``harness.load_run``,
``harness.build_model``). ``run`` and ``check`` take the command line's options as keyword
arguments and go through the same parser, defaults and validation as ``python -m harness``;
errors are raised (:class:`harness.HarnessError` subclasses), never printed, and nothing is
printed unless ``quiet=False`` asks for the progress lines on stderr.

Example (a notebook)::

    import harness

    run_dir = harness.run(variants=["baseline", "pre_norm"], seeds=2, preset="tiny")
    result = harness.load_run(run_dir)
    result.summary[["variant", "exact_match", "exact_match_low", "exact_match_high"]]
    model = harness.build_model("pre_norm", harness.ModelConfig(N=2, d_model=64, h=4))
"""
from __future__ import annotations

import argparse
import contextlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from .cli import build_parser
from .commands.common import check_output
from .errors import ConfigError

_Names = "str | Iterable[str]"


@dataclass
class LoadedRun:
    """A stored run as pandas tables (:func:`load_run`).

    Attributes:
        path: the run folder (``results/<run-id>``), absolute.
        meta: its ``config.json`` (command, config, seeds, environment, planned trials).
        trials: one row per stored trial, as ``trials.csv`` (``point`` "" without a sweep).
        curves: one row per logged step of every trial (variant, seed, point, split, step, ...).
        summary: one row per (variant, sweep point): the numbers behind report.md's results table,
            from the same aggregation (:func:`harness.report.aggregate`). Columns: ``n`` (trials
            that ran), ``n_ok``, ``n_failed``, ``params``, ``step_ms``, ``tokens_per_s``,
            ``early_loss_mean``/``_std``, ``heldout_ce``, ``exact_match``, ``token_acc`` (IQM
            over seeds) each with ``_low``/``_high`` (95% stratified-bootstrap CI),
            ``steps_to_solve_median``/``_q1``/``_q3`` (inf: not solved), ``time_to_solve_s``,
            ``solved``, ``diverged`` with ``diverged_low``/``_high`` (Wilson 95%),
            ``p_better``/``_low``/``_high`` and ``n_pairs`` (P(variant > baseline) on the
            comparison metric; NaN for the baseline), ``verdict`` and ``invalid``.
        table: report.md's results table as it is printed (strings).
        baseline: the variant every other is compared with.
        metric: the comparison metric (default ``heldout_ce``).
    """

    path: Path
    meta: dict
    trials: Any
    curves: Any
    summary: Any
    table: Any
    baseline: str | None
    metric: str


def _names(value: _Names) -> list[str]:
    return [value] if isinstance(value, str) else [str(v) for v in value]


def _set_options(overrides: dict | None) -> list[str]:
    """``{"train.steps": 50}`` -> ``["--set", "train.steps=50"]`` (values as Python literals)."""
    out: list[str] = []
    for key, value in (overrides or {}).items():
        out += ["--set", f"{key}={value!r}"]
    return out


def _plugin_options(plugins: _Names, plugin_files: _Names) -> list[str]:
    out: list[str] = []
    for m in _names(plugins):
        out += ["-p", m]
    for f in _names(plugin_files):
        out += ["--plugin", str(f)]
    return out


def _options(**values) -> list[str]:
    """``--name value`` for every value given (not None); ``True`` is a bare flag."""
    out: list[str] = []
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is not None and value is not False:
            out += [flag, str(value)]
    return out


def parse_command(argv: list[str]) -> argparse.Namespace:
    """``argv`` (a command and its options) parsed as ``python -m harness`` parses it, with the
    output options checked; ``args.argv`` keeps ``argv`` for the reports' command line.

    Raises:
        ConfigError: what argparse would print as ``harness: error: ...`` (exit 2).
    """
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = build_parser(commands=(argv[0],)).parse_args(argv)
    except SystemExit as exc:
        raise ConfigError(err.getvalue().strip().removeprefix("harness: error: ") or f"bad options: {argv}") from exc
    args.argv = list(argv)
    check_output(args)
    return args


def _run_folder(store, meta, report, interrupted, total) -> Path:
    """:func:`run`'s ending: the run folder, or the interrupt raised again."""
    if interrupted is not None:
        raise interrupted
    return store.root.resolve()


def run(variants: _Names = "all", seeds: int | None = None, preset: str | None = None,
        overrides: dict | None = None, task: str | None = None, results_dir: str | Path = "results",
        run_id: str | None = None, *, seed_start: int | None = None, device: str | None = None,
        dtype: str | None = None, jobs: int | str | None = None, threads: int | None = None,
        plugins: _Names = (), plugin_files: _Names = (), quiet: bool = True, load: bool = False):
    """Train ``variants`` x ``seeds`` on a task and write the run's report, as
    ``python -m harness run`` does (the same options; left out: the command line's default).

    Args:
        variants: ``"all"``, names and globs (a string or a list), as ``--variants``.
        seeds: seeds per variant (``--seeds``, default 1); ``seed_start`` the first one.
        preset: ``"quick"`` (default), ``"paper"`` or ``"tiny"``.
        overrides: ``{"train.steps": 200, "model.d_model": 128}``, as ``--set KEY=VALUE``.
        task: the task (``--task``; default the preset's).
        results_dir, run_id: where the run folder is made (``results/<run-id>``; default id: a
            timestamp).
        device, dtype, jobs, threads: as ``--device`` (``auto``), ``--dtype`` (``fp32``),
            ``--jobs`` (``auto``), ``--threads``.
        plugins, plugin_files: plugin modules (``-p``) and files (``--plugin``) to load.
        quiet: no progress lines on stderr (default).
        load: return :func:`load_run` of the run instead of its folder.

    Returns:
        Path | LoadedRun: the run folder (absolute; report.md, trials.csv, ...), or the loaded run. Trials
        that fail or diverge are in it (``trials.status``); they do not raise.

    Raises:
        HarnessError: bad input, as the command line's exit 2 (nothing is stored).
        KeyboardInterrupt: interrupted; the finished trials are stored (resume with
            ``python -m harness run --resume <folder>``).
    """
    from .commands import run as run_command

    argv = ["run", "--variants", *_names(variants), *_set_options(overrides), "--results-dir", str(results_dir)]
    argv += _options(task=task, preset=preset, seeds=seeds, seed_start=seed_start, run_id=run_id, device=device,
                     dtype=dtype, jobs=jobs, threads=threads, quiet=quiet)
    args = parse_command(argv + _plugin_options(plugins, plugin_files))
    path = run_command.main(args, finish=_run_folder)
    return load_run(path) if load else path


def check(variants: _Names = "all", *, preset: str | None = None, overrides: dict | None = None,
          device: str = "auto", dtype: str = "fp32", seed: int = 0, equivalent: Iterable[str] = (),
          all_components: bool = False, plugins: _Names = (), plugin_files: _Names = (), quiet: bool = True):
    """Check ``variants`` as ``python -m harness check`` does (equivalence matrix, PyTorch
    references, mask probes, faithful bugs) and return the report; nothing is stored.

    Args:
        variants: ``"all"``, names and globs, as ``--variants``.
        preset, overrides: the model config (default: the check config ``CHECK_MODEL``;
            ``overrides`` only ``model.*`` keys).
        device, dtype, seed: where and how the comparisons run.
        equivalent: ``["attention=annotated,my_attn"]``, as ``--equivalent``.
        all_components: hold every registered component to its slot's reference.
        plugins, plugin_files, quiet: as for :func:`run`.

    Returns:
        harness.checks.CheckReport: ``.ok`` (every result matches its declaration), the pairs,
        probes and references; ``harness.checks.render_text(report)`` prints it as the command does.

    Raises:
        HarnessError: bad input (unknown variant, bad config, unknown slot in ``equivalent``).
    """
    from .checks import parse_equivalent, registry_groups, run_checks
    from .commands.check import model_config
    from .commands.common import load_registry, select_variants
    from .commands.run import log_function
    from .env import resolve_device

    argv = ["check", "--variants", *_names(variants), *_set_options(overrides), "--device", device,
            "--dtype", dtype, "--seed", str(seed)]
    argv += [a for e in equivalent for a in ("--equivalent", e)]
    argv += _options(preset=preset, all_components=all_components, quiet=quiet)
    args = parse_command(argv + _plugin_options(plugins, plugin_files))
    reg = load_registry(args)
    extra = parse_equivalent(args.equivalent)
    for slot, groups in extra.items():
        for group in groups:
            for name in group:
                reg.component(slot, name)  # UnknownNameError for a typo
    cfg = model_config(args)
    log = log_function(args.quiet)
    return run_checks(reg, select_variants(reg, args), cfg, device=resolve_device(args.device), dtype=args.dtype,
                      seed=args.seed, groups=registry_groups(reg, extra, cfg), log=log,
                      all_components=args.all_components)


def load_run(path: str | Path, results_dir: str | Path = "results") -> LoadedRun:
    """Load a stored run into pandas tables, with the statistics report.md shows.

    Args:
        path: the run folder, a run id under ``results_dir``, or ``"latest"`` (as ``report``).

    Returns:
        LoadedRun: ``trials``, ``curves``, ``summary`` (numbers, with 95% CIs) and ``table``
        (report.md's results table).

    Raises:
        StoreError: no run there, or an unreadable ``config.json``.
    """
    from .commands.report import resolve_run
    from .experiments import spec_from_meta
    from .report import DEFAULT_METRIC, aggregate, curves_frame, resolve_baseline, summary_table, trials_frame

    store = resolve_run(str(path), str(results_dir))
    meta = store.meta()
    trials = trials_frame(store)
    spec = spec_from_meta(meta)
    metric = spec.metric if spec is not None and spec.kind == "train" else DEFAULT_METRIC
    baseline = resolve_baseline(trials, meta) if len(trials) else None
    rows = aggregate(trials, baseline, metric, meta) if len(trials) else []
    return LoadedRun(path=store.root.resolve(), meta=meta, trials=trials, curves=curves_frame(store),
                     summary=summary_frame(rows), table=summary_table(trials, baseline, metric, meta, rows),
                     baseline=baseline, metric=metric)


def summary_frame(rows: list[dict]):
    """:func:`harness.report.aggregate`'s rows as one flat numeric DataFrame (see :class:`LoadedRun`)."""
    import pandas as pd

    nan = float("nan")
    out = []
    for r in rows:
        c = r["comparison"]
        line = {k: r[k] for k in ("variant", "point", "n", "n_ok", "n_failed", "params", "step_ms", "tokens_per_s")}
        line["early_loss_mean"], line["early_loss_std"] = r["early_loss"]
        for metric in ("heldout_ce", "exact_match", "token_acc"):
            line[metric], line[f"{metric}_low"], line[f"{metric}_high"] = r[metric]
        line.update(zip(("steps_to_solve_median", "steps_to_solve_q1", "steps_to_solve_q3"), r["steps_to_solve"]))
        line.update({"time_to_solve_s": r["time_to_solve_s"], "solved": r["solved"], "diverged": r["diverged"][0],
                     "diverged_low": r["diverged"][2], "diverged_high": r["diverged"][3],
                     "p_better": c.p if c else nan, "p_better_low": c.low if c else nan,
                     "p_better_high": c.high if c else nan, "n_pairs": c.n_pairs if c else 0,
                     "verdict": c.verdict if c else None, "invalid": bool(r["invalid"])})
        out.append(line)
    return pd.DataFrame(out)


def build_model(variant, config=None, *, seed: int = 0, plugins: _Names = (), plugin_files: _Names = ()):
    """The model of ``variant`` alone, initialised from ``seed`` (as ``timm.create_model``).

    Args:
        variant: a variant name (buggy ones too) or a :class:`harness.Variant`.
        config: a :class:`harness.ModelConfig`, a dict of its fields, a :class:`harness.RunConfig`
            (its ``model``) or a preset name (default: the ``quick`` preset's model).
        plugins, plugin_files: plugin modules and files offering the variant or its components.

    Returns:
        harness.model.EncoderDecoder: an ``nn.Module``; ``model(src, tgt)`` gives the logits,
        shape ``(B, T, V)`` for token ids ``src`` ``(B, S)`` and ``tgt`` ``(B, T)`` (the masks are
        made by the variant's mask component unless given: ``model(src, tgt, src_mask, tgt_mask)``).

    Raises:
        UnknownNameError: no such variant or preset.  ConfigError: an invalid config.
    """
    from .config import ModelConfig, RunConfig, get_preset
    from .errors import ConfigError
    from .model import build_model as assemble
    from .plugins import PluginSpec
    from .registry import Registry, Variant

    reg = Registry.from_plugins(PluginSpec(modules=_names(plugins), files=[str(f) for f in _names(plugin_files)]))
    v = variant if isinstance(variant, Variant) else reg.select([str(variant)])[0]
    if config is None or isinstance(config, str):
        cfg = get_preset(config or "quick").model
    elif isinstance(config, dict):
        cfg = ModelConfig.from_dict(config)
    elif isinstance(config, RunConfig):
        cfg = config.model
    elif isinstance(config, ModelConfig):
        cfg = config
    else:
        raise ConfigError(f"config must be a ModelConfig, RunConfig, dict or preset name, got {type(config).__name__}")
    return assemble(reg, v, cfg, seed)
