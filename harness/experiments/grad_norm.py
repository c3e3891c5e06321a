"""The ``grad_norm_at_init`` experiment kind: gradient norms at initialisation against depth.

The run is an ordinary run (:func:`harness.launch.start_run`: run lock, interrupt guard, status,
resume, ``--jobs``): its plan (:func:`harness.experiments.plan_from_experiment`) gives every trial
a spec with ``measure`` (:mod:`harness.measure`), so each (variant, seed, depth) is measured and
stored as one trial. This module refuses a bad ``measure.parameter`` while planning
(:func:`check_parameter`) and renders the kind's own report (:func:`write_measurement_report`)
and its slope table (:func:`slope_table`); the predicted log-log slopes are data of the
experiment file (``[measure] theory_slope``, variant -> slope), read by the slope table, the
figure and the departures.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

import harness.experiments.figures as figures

from .. import stats
from ..config import RunConfig
from ..report import environment_block, to_markdown, trials_frame
from ..runmeta import RunMeta
from ..store import RunStore, atomic_write_text
from .parse import spec_from_meta
from .render import claim_sections, departure_sections, intro_sections
from .spec import Experiment, ExperimentError


def measure_grad_norms(model, cfg: RunConfig, seed: int, batches: int, parameter: str, device,
                       registry=None) -> dict[str, Any]:
    """:func:`harness.measure.measure_grad_norms` on the task ``cfg.train.task`` looked up in
    ``registry`` (default: the built-ins and installed plugins).

    Raises:
        ExperimentError: ``parameter`` is not a parameter of the layers.
        UnknownNameError: no task ``cfg.train.task`` in the registry.
    """
    from ..errors import ConfigError
    from ..measure import measure_grad_norms as measure
    from ..trial import registry_for

    task = (registry if registry is not None else registry_for(None)).task(cfg.train.task).for_config(cfg)
    try:
        return measure(model, cfg, seed, batches, parameter, device, task)
    except ConfigError as exc:
        raise ExperimentError(str(exc)) from exc


def check_parameter(plan, exp: Experiment, registry) -> None:
    """A bad ``measure.parameter`` is bad input: refuse it while planning, before a run folder exists.

    Raises:
        ExperimentError: naming the layer parameters of the variant that lacks it.
    """
    from ..model import build_model

    parameter = exp.measure["parameter"]
    for v in plan.variants:
        layers = {n.split(".", 3)[3] for n, _ in build_model(registry, v, plan.config.model, seed=0).named_parameters()
                  if n.startswith(("encoder.layers.0.", "decoder.layers.0."))}
        if parameter not in layers:
            raise ExperimentError(f"{exp.path}: key 'measure.parameter': {parameter!r} is not a layer parameter of "
                                  f"variant {v.name!r}; expected one of {', '.join(sorted(layers))}")


def slope_table(df, exp: Experiment):
    """Per variant and stack: the log-log slope of the last layer's gradient norm on N, and
    whether its 95 % CI contains the slope the experiment file predicts (``theory_slope``)."""
    rows = []
    if df.empty:
        return pd.DataFrame()
    theories = exp.measure.get("theory_slope", {})
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
            theory = theories.get(v)
            covers = "—" if theory is None or math.isnan(lo) else "yes" if lo <= theory <= hi else "no"
            rows.append({"variant": v, "stack": stack, "norm": g.iloc[0].get("slot_norm", ""),
                         f"slope of log ‖∇{exp.measure.get('parameter', 'w')}‖ on log N [95% CI]":
                             stats.fmt_ci(s, lo, hi, 3),
                         "theory (Xiong Thm 1)": "—" if theory is None else f"{theory:g}",
                         "CI contains theory": covers,
                         "N": ", ".join(map(str, Ns)), "seeds per N": int(g.groupby("N").size().min())})
    return pd.DataFrame(rows)


def write_measurement_run_report(store: RunStore) -> Path:
    """Re-render ``trials.csv``, ``curves.csv`` and ``report.md`` of a stored grad-norm run."""
    meta = store.meta()
    store.write_tables()
    return write_measurement_report(store, meta, trials_frame(store), spec_from_meta(meta))


def write_measurement_report(store, meta: RunMeta, df, exp: Experiment) -> Path:
    """report.md for ``kind = "grad_norm_at_init"``: norms per depth, slopes, claims, plots."""
    param = exp.measure.get("parameter", "feed_forward.w_2.weight")
    parts = [f"# Experiment `{exp.name}`: run `{meta.run_id or store.root.name}`", "",
             "Command:", "", f"```\n{meta.command}\n```", ""]
    parts += intro_sections(exp)
    parts += claim_sections(exp, df, [], None, exp.metric, meta)
    parts += departure_sections(exp, df, [], None, exp.metric, meta)
    parts += _setup_lines(meta, exp, param)
    parts += _measurement_lines(store, df, exp, param)
    parts += [f"Measurements: {len(df)}; run wall time: {float('nan') if meta.run_wall_s is None else meta.run_wall_s:.1f} s.", ""]
    path = store.root / "report.md"
    atomic_write_text(path, "\n".join(parts))
    return path


def _setup_lines(meta: RunMeta, exp: Experiment, param: str) -> list[str]:
    """Environment, Config (at the first depth) and what is measured."""
    parts = ["## Environment", "", environment_block(meta), ""]
    parts += ["## Config", "", f"Preset `{meta.preset}`, depth N swept over "
              f"{[int(c['model']['N']) for c in (meta.points or {}).values()]}; config at the first depth:", "",
              f"```json\n{json.dumps(meta.config, indent=1)}\n```", ""]
    parts += ["## What is measured", "",
              f"At initialisation (canonical init of each seed, no optimiser step), the gradient of the training "
              f"loss (label-smoothed cross-entropy) averaged over {exp.measure.get('batches')} copy-task "
              f"mini-batches of the seed's data stream; the Frobenius norm of that expected gradient for "
              f"`{param}` in every encoder and decoder layer. Headline: the **last decoder layer** "
              f"(`decoder.layers.{{N-1}}.{param}`, the FFN weight nearest the output, Xiong et al.'s W^(2,L)); "
              f"the last encoder layer is shown too. Slope: least squares of log norm on log N over all seeds, "
              f"95 % CI by a bootstrap stratified by N (seeds resampled within each depth).", ""]
    return parts


def _measurement_lines(store, df, exp: Experiment, param: str) -> list[str]:
    """Norms by depth, log-log slopes, failures and the two figures."""
    if df.empty:
        return ["_no measurements_", ""]
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
    parts = ["## Gradient norms by depth", "", to_markdown(pd.DataFrame(rows)), ""]
    parts += ["## Log-log slopes", "", "Theory (Xiong et al. 2020, Theorem 1): post-norm slope 0 "
              "(independent of N); pre-norm slope -0.5 (O(d sqrt(ln d / L))).", "",
              to_markdown(slope_table(df, exp)), ""]
    bad = df[df["status"] != "ok"]
    if not bad.empty:
        parts += ["## Failures", "", to_markdown(bad[["variant", "point", "seed", "status", "reason"]]), ""]
    theory = exp.measure.get("theory_slope", {})
    figs = [p for p in (figures.plot_grad_norm_depth(ok, store.root / "grad_norm_vs_depth.png", param, theory),
                        figures.plot_grad_norm_layers(store, ok, store.root / "grad_norm_per_layer.png", param)) if p]
    if figs:
        parts += ["## Plots", ""] + [f"![{p.stem}]({p.name})\n" for p in figs]
    return parts


def _ms(s) -> str:
    m, sd = stats.mean_std(s)
    if math.isnan(m):
        return "—"
    return f"{m:.4g}" if math.isnan(sd) else f"{m:.4g} ± {sd:.2g}"


