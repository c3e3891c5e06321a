"""Python API: the command line's ``run``, ``check``, ``compare``, ``verify`` and reports as
functions, and the model alone.

Re-exported lazily from :mod:`harness` (``harness.run``, ``harness.check``, ``harness.compare``,
``harness.verify``, ``harness.load_run``, ``harness.build_model``). ``run`` and ``check`` take the
command line's options as keyword arguments and build the same typed request as ``python -m
harness`` (:mod:`harness.request`), started by the same function (:mod:`harness.launch`,
:mod:`harness.checking`); ``compare`` and ``verify`` call the commands' functions
(:mod:`harness.report.compare`, :mod:`harness.verification`); no command line is built or parsed;
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

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from .errors import HarnessError
from .plugins import PluginSpec
from .request import CheckRequest, RunRequest, names, override_items, split_patterns

if TYPE_CHECKING:
    from .runmeta import RunMeta

_Names = "str | Iterable[str]"


class RunFailedError(HarnessError):
    """A run none of whose trials finished ok (every one failed, diverged or is invalid); the run
    folder keeps each failure with its reason. Exit code 1, as a run with a failed trial."""

    exit_code = 1


@dataclass
class LoadedRun:
    """A stored run as pandas tables (:func:`load_run`).

    Attributes:
        path: the run folder (``results/<run-id>``), absolute.
        meta: its ``config.json`` as a :class:`harness.runmeta.RunMeta` (``command``, ``config``,
            ``seeds``, ``environment``, planned ``trials`` ...).
        trials: one row per stored trial, as ``trials.csv`` (``point`` "" without a sweep).
        curves: one row per logged step of every trial (variant, seed, point, split, step, ...).
        summary: one row per (variant, sweep point): the numbers behind report.md's results table,
            from the same aggregation (:func:`harness.report.aggregate`). Columns: ``n`` (trials
            that ran), ``n_ok``, ``n_failed``, ``params``, ``step_ms``, ``tokens_per_s``,
            ``early_loss_mean``/``_std``, ``heldout_ce``, ``exact_match``, ``token_acc`` (IQM
            over seeds) and each metric the task adds (``g2p``: ``wer``, ``per``; a plugin task's own) each
            with ``_low``/``_high`` (95% stratified-bootstrap CI),
            ``steps_to_solve_median``/``_q1``/``_q3`` (inf: not solved), ``time_to_solve_s``,
            ``solved``, ``diverged`` with ``diverged_low``/``_high`` (Wilson 95%),
            ``p_better``/``_low``/``_high`` and ``n_pairs`` (P(variant > baseline) on the
            comparison metric; NaN for the baseline), ``verdict`` and ``invalid``.
        table: report.md's results table as it is printed (strings).
        baseline: the variant every other is compared with.
        metric: the comparison metric (default: the experiment's, else the task's primary metric:
            ``heldout_ce``, ``wer`` for ``g2p``).
    """

    path: Path
    meta: "RunMeta"
    trials: Any
    curves: Any
    summary: Any
    table: Any
    baseline: str | None
    metric: str


def _place(value: str | Path | bool | None) -> str | None:
    """An option with an optional place (``--tensorboard [DIR]``, ``--mlflow [URI]``) as the request holds it:
    True -> ``""`` (the default place), None or False -> None (not asked for), else the place as str."""
    return None if value is None or value is False else "" if value is True else str(value)


def run(variants: _Names = "all", seeds: int | None = None, preset: str | None = None,
        overrides: dict | None = None, task: str | None = None, results_dir: str | Path = "results",
        run_id: str | None = None, *, seed_start: int | None = None, device: str | None = None,
        dtype: str | None = None, jobs: int | str | None = None, threads: int | None = None,
        plugins: _Names = (), plugin_files: _Names = (), quiet: bool = True, load: bool = False,
        check: bool = True, tensorboard: str | Path | bool | None = None, save_models: bool = False,
        vectorise_seeds: str | None = None, capture: str | None = None, resume: str | Path | None = None,
        allow_code_change: bool = False, mlflow: str | bool | None = None, trial_timeout=None, time_budget=None,
        baseline: str | None = None, keep_checkpoints: bool = False, lr_grid=None, vectorize_seeds=None):
    """Train ``variants`` x ``seeds`` on a task and write the run's report, as ``python -m harness run`` does (the
    same options and defaults, through the same :class:`harness.request.RunRequest` and :func:`harness.launch.start_run`).

    Works from a notebook, a plain script (no ``if __name__ == "__main__":`` guard needed) and ``python -c``.

    Args:
        variants: ``"all"``, names and globs (a string or a list), as ``--variants``.
        seeds: seeds per variant (``--seeds``, default 1); ``seed_start`` the first one.
        preset: a preset's name (default ``"quick"``; ``python -m harness list``; :data:`harness.config.PRESETS`).
        overrides: ``{"train.steps": 200, "model.d_model": 128}``, as ``--set KEY=VALUE``; task: ``--task``.
        results_dir, run_id: where the run folder is made (``results/<run-id>``; default id: a timestamp).
        device, dtype, jobs, threads: as ``--device`` (``auto``), ``--dtype`` (``fp32``), ``--jobs`` (``auto``), ``--threads``.
        plugins, plugin_files: plugin modules (``-p``) and files (``--plugin``) to load.
        quiet: no progress lines on stderr (default). load: return :func:`load_run` of the run, not its folder.
        check: record check's equivalence classes before training (``--no-check``: False).
        tensorboard: ``--tensorboard``: True writes every trial's curves (as it trains), final metrics and hparams
            as TensorBoard events in ``<run folder>/tensorboard/``, a folder ``DIR`` in ``DIR/<run id>/``.
        mlflow: ``--mlflow``: True logs each trial as it trains to MLflow in ``<run folder>/mlruns``, a str to that URI.
        save_models, keep_checkpoints: ``--save-models`` (``models/<key>.pt``; :func:`load_model`), ``--keep-checkpoints``.
        vectorise_seeds, capture: ``--vectorise-seeds``, ``--capture``: ``"auto"`` (default: on with CUDA), ``"on"``
            (``capture``: CUDA only), ``"off"``; ``vectorize_seeds``: the old spelling, still read.
        resume: ``--resume``: a stored run's folder; its missing trials run (``variants="all"``: the stored ones).
        allow_code_change: ``--allow-code-change``: with ``resume``, go on with other code (recorded; else StoreError).
        trial_timeout, time_budget: ``--trial-timeout`` / ``--time-budget``, seconds (:mod:`harness.executors.limits`).
        baseline, lr_grid: ``--baseline`` (default ``"baseline"``, else required); ``--lr-grid`` (``[3e-4, 1e-3]``).

    Returns:
        Path | LoadedRun: the run folder (absolute; report.md, trials.csv, ...), or the loaded run. Trials
        that fail or diverge are in it (``trials.status``); they do not raise unless none finished ok.

    Raises:
        HarnessError: bad input, as the command line's exit 2 (nothing is stored); ResourceError (exit 1): a full disk.
        RunFailedError: no trial of the run finished ok (the folder keeps every failure and its reason).
        KeyboardInterrupt: interrupted; the finished trials are stored (resume with ``resume=<folder>``).
    """
    from .launch import start_run

    overrides = {**(overrides or {}), **({} if task is None else {"train.task": task})}
    request = RunRequest(
        variants=None if resume is not None and variants == "all" else names(variants), preset=preset, seeds=seeds,
        overrides=override_items(overrides), seed_start=seed_start, check=check, device=device, dtype=dtype, jobs=jobs,
        threads=threads, plugins=_plugin_spec(plugins, plugin_files), results_dir=str(results_dir), run_id=run_id,
        quiet=quiet, tensorboard=_place(tensorboard), mlflow=_place(mlflow), save_models=save_models, capture=capture,
        vectorise_seeds=vectorize_seeds or vectorise_seeds, resume=None if resume is None else str(resume),
        allow_code_change=allow_code_change, trial_timeout=trial_timeout, time_budget=time_budget, baseline=baseline,
        keep_checkpoints=keep_checkpoints, lr_grid=None if lr_grid is None else tuple(lr_grid))
    outcome = start_run(request)
    if outcome.interrupted is not None:
        raise outcome.interrupted
    _raise_if_none_ok(outcome)
    return load_run(outcome.store.root.resolve()) if load else outcome.store.root.resolve()


def _raise_if_none_ok(outcome) -> None:
    """Raises RunFailedError when no trial of the run finished ok (naming the first failure)."""
    bad = outcome.bad_rows()
    if bad and len(bad) == outcome.done():
        first = bad[0]
        raise RunFailedError(f"none of the {len(bad)} trial(s) finished ok (first: {first.get('variant')} "
                             f"s{first.get('seed')} {first.get('status')}: {str(first.get('reason', ''))[:200]}); "
                             f"every failure is stored in {outcome.store.root}")


def _plugin_spec(plugins: _Names, plugin_files: _Names) -> PluginSpec:
    return PluginSpec(modules=list(names(plugins) or ()), files=[str(f) for f in (names(plugin_files) or ())])


def check(variants: _Names = "all", *, preset: str | None = None, overrides: dict | None = None,
          device: str = "auto", dtype: str = "fp32", seed: int = 0, equivalent: Iterable[str] = (),
          all_components: bool = False, plugins: _Names = (), plugin_files: _Names = (), quiet: bool = True,
          results_dir: str | Path = "results", run_id: str | None = None):
    """Check ``variants`` as ``python -m harness check`` does (equivalence matrix, PyTorch
    references, mask probes, faithful bugs), write the same record
    (``<results_dir>/checks/<run_id>/``: ``config.json``, ``checks.csv``, ``checks.md``) and
    return the outcome.

    Args:
        variants: ``"all"``, names and globs, as ``--variants``.
        preset, overrides: the model config (default: the check config ``CHECK_MODEL``;
            ``overrides`` only ``model.*`` keys).
        device, dtype, seed: where and how the comparisons run.
        equivalent: ``["attention=annotated,my_attn"]``, as ``--equivalent``.
        all_components: hold every registered component to its slot's reference.
        plugins, plugin_files, quiet: as for :func:`run`.
        results_dir, run_id: where the record goes (default id ``check-<timestamp>``).

    Returns:
        harness.request.CheckOutcome: ``.ok`` (every result matches its declaration), ``.report``
        (the :class:`harness.checks.CheckReport`: pairs, probes, references, ``classes()``;
        ``harness.checks.render_text(outcome.report)`` prints it as the command does), ``.store``
        (the record's folder), ``.csv``, ``.markdown`` (docs/python.md).

    Raises:
        HarnessError: bad input (unknown variant, bad config, unknown slot in ``equivalent``, bad
        ``run_id``), before anything runs.
    """
    from .checking import start_check

    request = CheckRequest(variants=names(variants), preset=preset, overrides=override_items(overrides),
                           device=device, dtype=dtype, seed=seed, equivalent=tuple(equivalent),
                           all_components=all_components, plugins=_plugin_spec(plugins, plugin_files), quiet=quiet,
                           results_dir=results_dir, run_id=run_id)
    return start_check(request)


def compare(run_a: str | Path, run_b: str | Path, *, metrics: _Names | None = None, tolerance: float = 0.0,
            results_dir: str | Path = "results"):
    """Compare the reference run ``run_a`` with the candidate ``run_b`` per variant (x sweep point), as
    ``python -m harness compare`` does (its rules: docs/statistics.md).

    Args:
        run_a, run_b: a run folder, a run id under ``results_dir``, or ``"latest"``.
        metrics: the metrics to compare (names or a comma-separated string); None: ``heldout_ce`` and
            ``exact_match``, plus ``wer`` and ``per`` for g2p: the metrics both runs' tasks show in ``compare``.
        tolerance: a difference must exceed it (absolute, in the metric's unit) beyond its 95 % CI.

    Returns:
        harness.report.compare.CompareOutcome: ``.table`` (pandas, one row per variant and metric with
        a ``status``), ``.ok`` (nothing regressed: the command's exit status 0), ``.regressed``,
        ``.config_differences``, ``.verdict()``.

    Raises:
        HarnessError: not a run, a run without trials, a measurement run, nothing in common, an
        unknown metric or a negative tolerance.
    """
    from .lookup import resolve_run
    from .report.compare import compare_runs

    chosen = None if metrics is None else split_patterns(names(metrics))
    return compare_runs(resolve_run(str(run_a), str(results_dir)), resolve_run(str(run_b), str(results_dir)),
                        chosen, tolerance)


def verify(run: str | Path, *, results_dir: str | Path = "results"):
    """Check that a stored run (or a check/bench record) is complete and intact, read-only, as
    ``python -m harness verify`` does: config.json, every trial file's schema and checksum, the
    tables against the trial files, planned against stored trials.

    Args:
        run: a run folder, a run id under ``results_dir``, or ``"latest"``.

    Returns:
        harness.verification.VerifyOutcome: ``.ok``, ``.problems`` (one line per defect, paths relative
        to the run folder), ``.notes``, ``.summary()``.

    Raises:
        HarnessError: ``run`` is not a run folder (a damaged run is never an error: its defects are
        problems).
    """
    from .lookup import resolve_run
    from .verification import verify_store

    return verify_store(resolve_run(str(run), str(results_dir), records=True))


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
    from .lookup import resolve_run
    from .experiments import spec_from_meta
    from .report import aggregate, curves_frame, resolve_baseline, run_primary, summary_table, trials_frame

    store = resolve_run(str(path), str(results_dir))
    meta = store.meta()
    trials = trials_frame(store)
    spec = spec_from_meta(meta)
    metric = (spec.metric if spec is not None and spec.kind == "train" else None) or run_primary(meta)
    baseline = resolve_baseline(trials, meta) if len(trials) else None
    rows = aggregate(trials, baseline, metric, meta) if len(trials) else []
    return LoadedRun(path=store.root.resolve(), meta=meta, trials=trials, curves=curves_frame(store),
                     summary=summary_frame(rows), table=summary_table(trials, baseline, metric, meta, rows),
                     baseline=baseline, metric=metric)


def summary_frame(rows: list):
    """:func:`harness.report.aggregate`'s rows (:class:`harness.report.SummaryRow`) as one flat numeric
    DataFrame (columns: see :class:`LoadedRun`). ``same_function``: check proves the variant computes
    the baseline's function; its ``verdict`` is then "same function" and ``p_better`` (with
    ``_low``/``_high``) is NaN, since its paired outcomes are rounding (``n_pairs`` still counts them)."""
    import pandas as pd

    from .report import Interval

    nan = float("nan")
    own = list(dict.fromkeys(k for r in rows for k in r.extra))
    out = []
    for r in rows:
        c = r.comparison
        shown = c if c is not None and not r.same_function else None
        line = {"variant": r.variant, "point": r.point, "n": r.n, "n_ok": r.n_ok, "n_failed": r.n_failed,
                "params": r.params, "step_ms": r.step_ms, "tokens_per_s": r.tokens_per_s,
                "early_loss_mean": r.early_loss.mean, "early_loss_std": r.early_loss.std}
        for metric in ("heldout_ce", "exact_match", "token_acc", *own):  # own: the task's metrics (g2p: wer, per)
            iv = r.extra.get(metric, getattr(r, metric, None)) or Interval(nan, nan, nan)
            line[metric], line[f"{metric}_low"], line[f"{metric}_high"] = iv.value, iv.low, iv.high
        s = r.steps_to_solve
        line.update({"steps_to_solve_median": s.median, "steps_to_solve_q1": s.q1, "steps_to_solve_q3": s.q3,
                     "time_to_solve_s": r.time_to_solve_s, "solved": r.solved, "diverged": r.diverged.k,
                     "diverged_low": r.diverged.low, "diverged_high": r.diverged.high,
                     "p_better": shown.p if shown else nan, "p_better_low": shown.low if shown else nan,
                     "p_better_high": shown.high if shown else nan, "n_pairs": c.n_pairs if c else 0,
                     "verdict": r.verdict, "same_function": bool(r.same_function), "invalid": bool(r.invalid)})
        out.append(line)
    return pd.DataFrame(out)


def list_variants(*, buggy: bool = False, plugins: _Names = (), plugin_files: _Names = ()):
    """The registered variants, as ``python -m harness list`` shows them.

    Args:
        buggy: include the faithful-bug variants (``bug_*``).
        plugins, plugin_files: plugin modules and files to load first.

    Returns:
        pandas.DataFrame: one row per variant: ``variant``, one column per slot (its component),
        ``changed`` (the slots that differ from the defaults, ``"norm=pre"``), ``summary``, ``source``,
        ``plugin``, ``buggy``.
    """
    import pandas as pd

    from .registry import Registry

    reg = Registry.from_plugins(_plugin_spec(plugins, plugin_files))
    rows = []
    for v in reg.variants.values():
        if v.buggy and not buggy:
            continue
        slots = v.resolved(reg.defaults)
        rows.append({"variant": v.name, **slots,
                     "changed": ", ".join(f"{k}={c}" for k, c in slots.items() if c != reg.defaults[k]),
                     "summary": v.summary, "source": v.source, "plugin": v.plugin, "buggy": bool(v.buggy)})
    return pd.DataFrame(rows)


def list_tasks(*, plugins: _Names = (), plugin_files: _Names = ()):
    """The registered tasks (``--task NAME``): a DataFrame with ``task``, ``summary``, ``source``, ``plugin``."""
    import pandas as pd

    from .registry import Registry

    reg = Registry.from_plugins(_plugin_spec(plugins, plugin_files))
    return pd.DataFrame([{"task": t.name, "summary": t.summary, "source": t.source, "plugin": t.plugin}
                         for t in reg.tasks.values()], columns=["task", "summary", "source", "plugin"])


def list_presets() -> dict[str, str]:
    """Preset name -> what it is (``preset=`` of :func:`run`); the configs are ``harness.config.PRESETS``."""
    from .config import PRESET_NOTES

    return dict(PRESET_NOTES)


def list_settings():
    """Every config key ``overrides=`` (``--set``) takes, as a pandas DataFrame: ``key`` (``model.*``,
    ``train.*``, ``task.*``), ``type``, ``default`` and ``meaning`` (``python -m harness list --settings``;
    :func:`harness.settings.setting_rows`)."""
    import pandas as pd

    from .config import config_sections
    from .settings import setting_rows

    return pd.DataFrame(setting_rows(config_sections()))


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
    from .config import DEFAULT_PRESET, ConfigError, ModelConfig, RunConfig, get_preset
    from .model import build_model as assemble
    from .registry import Registry, Variant

    reg = Registry.from_plugins(_plugin_spec(plugins, plugin_files))
    v = variant if isinstance(variant, Variant) else reg.select([str(variant)])[0]
    if config is None or isinstance(config, str):
        cfg = get_preset(config or DEFAULT_PRESET).model
    elif isinstance(config, dict):
        cfg = ModelConfig.from_dict(config)
    elif isinstance(config, RunConfig):
        cfg = config.model
    elif isinstance(config, ModelConfig):
        cfg = config
    else:
        raise ConfigError(f"config must be a ModelConfig, RunConfig, dict or preset name, got {type(config).__name__}")
    return assemble(reg, v, cfg, seed)


def load_model(run, variant: str = "baseline", seed: int = 0, point: str = "", *, device: str = "cpu",
               results_dir: str | Path = "results"):
    """The trained model of one trial of a run made with ``save_models=True`` (``--save-models``),
    rebuilt from the run's stored spec (variant, config, plugins) with its final weights, in eval mode.

    Args:
        run: the run folder, a run id under ``results_dir`` or ``"latest"``.
        variant, seed, point: which trial (``point``: the sweep point, ``""`` without a sweep).
        device: ``"cpu"`` or ``"cuda"``.

    Returns:
        harness.model.EncoderDecoder: ``model(src, tgt)`` gives logits (B, T, V) for ids ``src``
        (B, S) and ``tgt`` (B, T).

    Raises:
        ConfigError: no such trial, or the run kept no weights.  StoreError: no such run, or a
            weights file missing or failing its SHA-256 (docs/python.md).
    """
    from .saved import load_model as load

    return load(run, variant, seed, point, device=device, results_dir=str(results_dir))


def decode(run, texts: _Names, variant: str = "baseline", seed: int = 0, *, beam: int = 1, point: str = "",
           device: str = "cpu", results_dir: str | Path = "results") -> list[str]:
    """``python -m harness decode``: the saved model of one trial on new input, one output per text,
    read and written by the run's task (g2p: a word's letters in, ARPAbet phonemes out; other tasks:
    token ids as ``"3 4 5"``); greedy decoding, or beam search of width ``beam``.

    Raises:
        ConfigError: an input the task cannot read, ``beam < 1``, or what :func:`load_model` raises.
    """
    from .saved import decode_texts, load_model as load

    model, cfg, task = load(run, variant, seed, point, device=device, results_dir=str(results_dir),
                            with_config=True)
    return decode_texts(model, cfg, task, list(names(texts) or ()), beam=beam, device=device)
