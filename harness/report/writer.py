"""``report.md``: the sections of a run's report, in order, and the hook for extra sections.

:func:`write_report` renders ``trials.csv``, ``curves.csv``, the PNG figures and ``report.md``
from what a run stored. It knows nothing of where extra sections come from: a caller (an
experiment, a future overview of ``check``) hands it :class:`Section` objects, each with a
position (:data:`POSITIONS`) and either fixed markdown lines or a renderer called with the
report's :class:`ReportContext`. Adding a section is one more item in ``sections=[...]``.

Order of ``report.md``: title; the partial-run banner (:mod:`.partial`); "Invalid variants"; the command; ``top`` sections; Environment;
Config; Sweep; Variants; Results; Failures; Paired seeds on every metric (:mod:`.paired`); Learning-rate
tuning (a ``train.lr`` sweep: :mod:`.tuning`); Unreadable
trial files; ``after_results`` sections;
Plots; the trial count and wall time; ``end`` sections.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence, Union

import pandas as pd

import harness.report.plots as plots

from ..metrics import FROM_DEV, FROM_TRAINING, dev_column, shown
from ..runmeta import RunMeta

from ..store import RunStore, atomic_write_text
from .frames import TRAINED, _num, baseline_note, curves_frame, invalid_variants, resolve_baseline, run_metrics, run_primary, \
    trials_frame, variant_order, verdict_metric
from .paired import paired_lines
from .partial import partial_banner
from .tuning import tuning_lines
from .tables import aggregate, caption, environment_block, summary_table, sweep_table, to_markdown, variants_table

#: Where an extra section goes: after the command block (before Environment), after the
#: results (Failures, unreadable files) and before the plots, or after everything else.
POSITIONS = ("top", "after_results", "end")


@dataclass(frozen=True)
class ReportContext:
    """What a section renderer may read: the run and the numbers the main table shows.

    ``df`` is :func:`harness.report.trials_frame` of the run, ``rows`` its
    :func:`harness.report.aggregate` (empty without trials), ``baseline`` and ``metric`` the
    resolved comparison; ``requested``: the baseline the caller asked for (None: the run's own).
    """

    store: RunStore
    meta: RunMeta
    df: pd.DataFrame
    rows: list
    baseline: str | None
    metric: str
    requested: str | None = None


SectionRenderer = Callable[[ReportContext], list]


@dataclass(frozen=True)
class Section:
    """One extra part of ``report.md``: markdown lines, or a renderer returning them.

    Args:
        position: one of :data:`POSITIONS`.
        content: a list of markdown lines, or ``f(ReportContext) -> list[str]``.

    Raises:
        ValueError: an unknown position.
    """

    position: str
    content: Union[Sequence[str], SectionRenderer]

    def __post_init__(self):
        if self.position not in POSITIONS:
            raise ValueError(f"unknown section position {self.position!r}; expected one of {', '.join(POSITIONS)}")

    def lines(self, ctx: ReportContext) -> list[str]:
        return list(self.content(ctx) if callable(self.content) else self.content)


def write_report(store: RunStore, baseline: str | None = None, metric: str | None = None,
                 sections: Sequence[Section] = (), title: str = "transformer-harness run") -> Path:
    """Render ``trials.csv``, ``curves.csv``, the PNG figures and ``report.md`` from the stored trials.

    Args:
        store: the run.
        baseline: variant every other is compared with (default: :func:`resolve_baseline`).
        metric: comparison metric for P(A > B) (default: the task's primary metric,
            :attr:`harness.tasks.base.Task.primary_metric`: ``heldout_ce``, ``wer`` for ``g2p``).
        sections: extra sections, each placed at its position (in the given order).
        title: the heading before ``: run `RUN-ID```.

    Returns:
        The path of ``report.md``.

    Raises:
        StoreError: unreadable ``config.json``.  ConfigError: a metric the task does not declare for verdicts.
    """
    meta = store.meta()
    store.write_tables()
    df = trials_frame(store)
    metrics = run_metrics(meta)
    metric = metric or run_primary(meta)
    verdict_metric(metric, metrics)
    requested, baseline = baseline, resolve_baseline(df, meta, baseline)
    rows = aggregate(df, baseline, metric, meta, metrics=metrics) if len(df) else []
    ctx = ReportContext(store, meta, df, rows, baseline, metric, requested)

    def at(position: str) -> list[str]:
        return [line for s in sections if s.position == position for line in s.lines(ctx)]

    parts = [f"# {title}: run `{meta.run_id or store.root.name}`", ""]
    parts += partial_banner(store, meta)
    parts += invalid_section(df)
    parts += ["Command:", "", f"```\n{meta.command}\n```", ""]
    parts += at("top")
    parts += _setup_lines(meta, df, baseline)
    parts += _result_lines(ctx)
    parts += paired_lines(ctx)
    parts += tuning_lines(ctx)
    parts += unreadable_section(store)
    parts += at("after_results")
    parts += _plot_lines(ctx)
    total = _num(df, "wall_s").sum() if len(df) else 0.0
    parts += [f"Trials: {len(df)}; summed trial wall time: {total:.1f} s; "
              f"run wall time: {float('nan') if meta.run_wall_s is None else meta.run_wall_s:.1f} s.", ""]
    parts += at("end")
    path = store.root / "report.md"
    atomic_write_text(path, "\n".join(parts))
    return path


def invalid_section(df: pd.DataFrame) -> list[str]:
    """The report's opening "Invalid variants" section (empty list when there are none)."""
    bad = invalid_variants(df)
    if not bad:
        return []
    lines = ["## Invalid variants", "",
             "These variants use a component that breaks its slot's contract (docs/components.md) or failed an "
             "integrity probe (a decoder that sees the future, a padding mask that does not hold, non-finite "
             "gradients) at initialisation or after training. Their numbers are shown "
             "below so you can see what the leak buys, but they are excluded from every verdict, ranking and "
             "P(A > B). Diagnose the component with `python -m harness check --variants NAME`.", ""]
    for variant, reasons in bad.items():
        g = df[(df["variant"] == variant) & (df["status"] == "invalid")]
        seeds = ", ".join(str(s) for s in sorted(set(g["seed"])))
        lines.append(f"- **{variant}** (seeds {seeds}): " + "; ".join(reasons[:3]))
    return lines + [""]


def _setup_lines(meta: RunMeta, df: pd.DataFrame, baseline: str | None) -> list[str]:
    """Environment, Config, Sweep (when swept) and Variants (when there are trials)."""
    parts = ["## Environment", "", environment_block(meta), ""]
    parts += ["## Config", "", f"Preset `{meta.preset}`; resolved:", "",
              f"```json\n{json.dumps(meta.config, indent=1)}\n```", ""]
    if meta.points:
        parts += ["## Sweep", "", "Each point is the config above with these values (lr_max: the largest "
                  "Adam step size the schedule reaches).", "", to_markdown(sweep_table(meta.points)), ""]
    if len(df):
        order = variant_order(df, baseline, meta)
        parts += ["## Variants", "", to_markdown(variants_table(df, order)), ""]
    return parts


def _result_lines(ctx: ReportContext) -> list[str]:
    """Results (caption, evaluation-set note, main table) and Failures (trials that did not train)."""
    meta, df, baseline, metric = ctx.meta, ctx.df, ctx.baseline, ctx.metric
    held = meta.heldout or ("evaluation set: overlap with the training stream not recorded (a run "
                                    "made before the evaluation set was drawn disjoint from training)")
    ctx.store.summary = summary_table(df, baseline, metric, meta, ctx.rows)  # the terminal prints this one
    parts = ["## Results", "", caption(meta, df, baseline, metric, note=baseline_note(df, meta, baseline, ctx.requested)) if len(df) else "", "",
             f"_{held[0].upper() + held[1:]}._", "",
             to_markdown(ctx.store.summary), ""]
    parts += split_lines(df, run_metrics(meta)) if len(df) else []
    if len(df) and "status" in df:
        bad = df[~df["status"].isin(TRAINED)]
        if not bad.empty:
            cols = [c for c in ("variant", "point", "seed", "status", "reason") if c in bad]
            parts += ["## Failures", "", "Diverged runs stay in every table (never dropped silently); runs "
                      "that raised an error are excluded from the statistics.", "", to_markdown(bad[cols]), ""]
    return parts


def split_lines(df: pd.DataFrame, metrics) -> list[str]:
    """The line under the main table saying which split each number comes from (:mod:`harness.tasks.splits`),
    with the ``trials.csv`` columns; a run stored before the dev split (no ``dev_`` column) is said to be one."""
    if not any(c.startswith("dev_") for c in df.columns):
        return ["_Splits: this run was stored before the dev split: its periodic evaluations scored sequences drawn "
                "like the test set (not kept apart from it) and its final numbers the test set._", ""]

    def names(ms) -> str:
        return ", ".join(re.sub(r" (IQM \[95% CI\]|median \[IQR\]|\(median\))$", "", m.header) for m in ms)
    test = [m for m in metrics if m.name not in FROM_DEV + FROM_TRAINING]
    dev = [m for m in shown(metrics, "table") if m.name in FROM_DEV]
    dev_cols = [c for c in (dev_column(m.name) for m in test) if c in df.columns]
    return [f"_Splits: **test set** (scored once, after training): {names(shown(test, 'table'))} (trials.csv "
            f"{', '.join(f'`{m.name}`' for m in test)}), every P(> baseline) and verdict. **Dev set** (disjoint from "
            f"training and test; what every selection reads): {names(dev) + ' and ' if dev else ''}the curves' "
            f"evaluation points; its final numbers are trials.csv's {', '.join(f'`{c}`' for c in dev_cols)}._", ""]


def _plot_lines(ctx: ReportContext) -> list[str]:
    """Draw the figures into the run folder; the "Plots" section linking them (empty without any)."""
    store, df, rows, meta = ctx.store, ctx.df, ctx.rows, ctx.meta
    figs = []
    series = plots._series(df, meta, ctx.baseline) if len(df) else None
    curves = curves_frame(store)
    png = plots.plot_curves(curves, store.root / "curves.png", series)
    if png:
        figs.append((f"Training and {plots.eval_name(curves)} curves", png))
    png = plots.plot_final_metrics(df, rows, store.root / "final_metrics.png", run_metrics(meta)) if rows else None
    if png:
        em = any(m.name == "exact_match" for m in shown(run_metrics(meta), "plot"))
        figs.append(("Final test cross-entropy and exact-match" if em else "Final test metrics", png))
    budget = meta.config.get("train", {}).get("steps")
    solving = any(m.name == "steps_to_solve" for m in run_metrics(meta))  # g2p's exact match never nears 1
    png = plots.plot_steps_to_solve(df, rows, store.root / "steps_to_solve.png", budget) if rows and solving else None
    if png:
        figs.append(("Steps to solve", png))
    if not figs:
        return []
    parts = ["## Plots", ""]
    same = [r.variant for r in rows if r.same_function and not r.invalid]
    if same:
        parts += [f"Hatched rows marked `{plots.SAME_FUNCTION_MARK}` ({', '.join(dict.fromkeys(same))}): `check` "
                  f"proves they compute the same function as `{ctx.baseline}` (same outputs and gradients from the "
                  "same weights, recorded in `config.json` under `check`), so their differences from it are "
                  "floating-point rounding, not an effect.", ""]
    for name, p in figs:
        parts += [f"### {name}", "", f"![{name}]({p.name})", ""]
    return parts


def unreadable_section(store: RunStore) -> list[str]:
    """Report lines naming the trial files that could not be read (``trials/quarantine/``)."""
    moved = store.quarantined()
    if not moved:
        return []
    rows = [{"file": f"trials/{q['original']}", "moved to": f"trials/quarantine/{q['file']}", "reason": q["reason"],
             "stored again": "yes" if (store.trials_dir / q["original"]).is_file() else "no"} for q in moved]
    return ["## Unreadable trial files", "", f"{len(rows)} trial file(s) could not be read (corrupt or foreign) "
            "and were moved to `trials/quarantine/`; their trials are not in any table above until they are "
            f"stored again (`python -m harness run --resume {store.root}` runs them).", "",
            to_markdown(pd.DataFrame(rows)), ""]
