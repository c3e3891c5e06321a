"""An experiment's sections of a run's report: what it is, the claims it checks, where the
miniature departs from the paper, its failure analysis. :func:`report_sections` hands them to
:func:`harness.report.write_report` as :class:`harness.report.Section` objects."""
from __future__ import annotations

import harness.experiments.figures as figures

from ..report import ReportContext, Section, to_markdown
from .claims import departures, evaluate_claim, failure_definition, failure_frame
from .spec import Experiment


def report_sections(exp: Experiment) -> list[Section]:
    """The experiment's sections of a training run's report: intro, claims and departures at
    the top, the failure analysis after the results."""
    def claims(ctx: ReportContext) -> list[str]:
        return claim_sections(exp, ctx.df, ctx.rows, ctx.baseline, ctx.metric, ctx.meta)

    def departed(ctx: ReportContext) -> list[str]:
        return departure_sections(exp, ctx.df, ctx.rows, ctx.baseline, ctx.metric, ctx.meta)

    def results(ctx: ReportContext) -> list[str]:
        return result_sections(ctx.store, exp, ctx.df, ctx.rows, ctx.baseline, ctx.metric, ctx.meta)

    return [Section("top", intro_sections(exp)), Section("top", claims), Section("top", departed),
            Section("after_results", results)]


def intro_sections(exp: Experiment) -> list[str]:
    """Description, source, file and caveats of an experiment (markdown lines)."""
    out = ["## Experiment", "", exp.description, ""]
    if exp.source:
        out += [f"Source: {exp.source}", ""]
    out += [f"File: `{exp.path}`; kind `{exp.kind}`; variants {list(exp.variants)}; seeds {list(exp.seeds)}; "
            f"{exp.n_points} sweep point(s).", ""]
    return out


def result_sections(store, exp: Experiment, df, rows, baseline, metric, meta) -> list[str]:
    """Experiment-specific sections after the main table (failure analysis)."""
    out: list[str] = []
    definition = failure_definition(exp)
    if definition and len(df):
        ff = failure_frame(df, exp, meta)
        out += ["## Convergence", "", f"Definition: {definition}. Failure rates are x/n with a Wilson 95 % "
                "interval; quality is reported separately over the runs that converged (Nguyen & Salazar 2019 "
                "and Liu et al. 2020 disagree on its sign, so it is shown, not judged).", "",
                to_markdown(ff[[c for c in ff.columns if not c.startswith("_")]]), ""]
        png = figures.plot_failures(ff, store.root / "failure_rate.png", definition)
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


