"""The suite's report: ``suite.md``, ``suite.csv`` and ``suite_verdicts.png`` from
:func:`harness.suite.run.collect`'s frame (see :mod:`harness.suite` for what a suite is).

Every number in the report comes from the task runs stored beside it; the findings are generated
from the verdicts, never written by hand.
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from scipy.stats import binom

from .. import stats
from ..overview import classes_section
from ..report.plots import atomic_savefig
from ..report.tuning import lr_cell
from ..runmeta import RunMeta
from ..metrics import BUILTIN
from .spec import SUITE_METRICS, SuiteSpec

#: name -> what the suite's verdict heading says of it, from the declarations (:data:`harness.metrics.BUILTIN`).
METRIC_TEXT = {name: f"{BUILTIN[name].text} ({BUILTIN[name].unit}, {BUILTIN[name].direction} is better)"
               for name in SUITE_METRICS}


def null_verdict_rate(n: int, alpha: float = stats.ALPHA) -> float:
    """Probability that the sign test gives p < ``alpha`` on ``n`` untied pairs when each pair is a
    fair coin (two variants computing the same function): the false-verdict rate of one comparison.
    6 pairs: 0.031; 8 pairs: 0.0078."""
    return float(sum(binom.pmf(k, n, 0.5) for k in range(n + 1) if stats.sign_test_p(k, n - k) < alpha))


SAME = "check: same function"  #: the relation of a variant in the reference's check class


def _counts(r: pd.Series) -> str:
    return f"{int(r['wins'])}-{int(r['losses'])}" + (f"-{int(r['ties'])}t" if r["ties"] else "")


def _cell(r: pd.Series) -> str:
    if r["verdict"] == "INVALID":
        return "INVALID"
    if r["relation"] == "reference":
        return "(reference)"
    if r["relation"] == SAME:
        return f"= same function ({_counts(r)})" if r["verdict"] else "= same function"
    if not r["verdict"]:
        return "—"
    counts = _counts(r)
    return f"**{r['verdict']}** {counts}" if r["verdict"] in ("better", "worse") else f"{r['verdict']} {counts}"


def _p_cell(r: pd.Series) -> str:
    if r["relation"] == "reference" or math.isnan(r["p"]):
        return ""
    return "=" if r["relation"] == SAME else _ci(r["p"], r["p_low"], r["p_high"], 2)


def _ci(point: float, low: float, high: float, digits: int = 3) -> str:
    return stats.fmt_ci(point, low, high, digits)


def _pivot(df: pd.DataFrame, spec: SuiteSpec, fmt) -> pd.DataFrame:
    order = list(dict.fromkeys(df["variant"]))
    tasks = [t for t in spec.tasks if t in set(df["task"])]
    table = pd.DataFrame(index=order, columns=tasks, dtype=object)
    for _, r in df.iterrows():
        table.loc[r["variant"], r["task"]] = fmt(r)
    table.insert(0, "check", [df[df["variant"] == v]["relation"].iloc[0] for v in order])
    table.index.name = "variant"
    return table.fillna("—").reset_index()


def _md(df: pd.DataFrame) -> str:
    from ..report import to_markdown

    return to_markdown(df)


def verdict_sections(df: pd.DataFrame, spec: SuiteSpec) -> list[str]:
    """Markdown lines: the verdict table and the metric tables (variant x task)."""
    return [f"## Verdicts vs `{spec.reference}` ({METRIC_TEXT[spec.metric]})", "",
            "Cell: verdict and paired outcomes wins-losses(-ties) over the seeds; **bold** = a claim. "
            "The `check` column says whether check proves the variant computes the same function as the "
            "reference; such a variant shows `= same function` and never gets a verdict or a probability: its "
            "paired outcomes are floating-point rounding (the negative control below counts what the sign test "
            "alone would have said).", "",
            _md(_pivot(df, spec, _cell)), "", "![P(A > B) per variant and task](suite_verdicts.png)", "",
            "## P(variant beats the reference) [95 % Wilson interval]", "",
            _md(_pivot(df, spec, _p_cell)), "",
            "## Held-out cross-entropy, IQM [95 % bootstrap CI] (nats/token)", "",
            _md(_pivot(df, spec, lambda r: _ci(r["ce"], r["ce_low"], r["ce_high"]))), "",
            "## Held-out exact match, IQM [95 % bootstrap CI] (greedy decoding)", "",
            _md(_pivot(df, spec, lambda r: _ci(r["em"], r["em_low"], r["em_high"]))), "",
            "## Mean held-out cross-entropy over training, IQM (nats/token; lower = learned earlier)", "",
            _md(_pivot(df, spec, lambda r: f"{r['auc']:.3f}" if not math.isnan(r["auc"]) else "—")), ""]


def negative_control(df: pd.DataFrame, spec: SuiteSpec) -> list[str]:
    """Markdown lines: the comparisons between variants check proves to compute the same function.

    They are reported as "same function", never as verdicts; this section counts how often the sign
    test alone (``test_verdict``; ``verdict`` in a frame without it) would have claimed a difference.
    """
    same = df[df["relation"] == SAME]
    n_pairs = int(same[["wins", "losses", "ties"]].sum(axis=1).max()) if len(same) else 0
    rate = null_verdict_rate(n_pairs) if n_pairs else 0.0
    raw = same["test_verdict"].fillna("") if "test_verdict" in same else same["verdict"]
    claims = same[raw.isin(["better", "worse"])]
    out = ["## Negative control: same function, different code", ""]
    if not len(same):
        return out + ["No variant shares the reference's check class: no negative control in this suite.", ""]
    out += [f"{len(same)} comparison(s) of `{spec.reference}` with variants that compute the same function "
            f"({', '.join(sorted(set(same['variant'])))}); the tables show them as `= same function`, never as "
            f"verdicts. With {n_pairs} pairs, none tied, the sign test alone would give such a pair a verdict "
            f"with probability {rate:.4f} (tied pairs lower it), so about {len(same) * rate:.2f} false "
            f"verdict(s) are expected here. Observed: **{len(claims)}**.", ""]
    for _, r in claims.iterrows():
        out.append(f"- FALSE POSITIVE of the sign test alone (not reported as a verdict): {r['variant']} on "
                   f"{r['task']}: {raw[r.name]} ({r['reason']})")
    return out + ([""] if len(claims) else [])


def findings(df: pd.DataFrame, spec: SuiteSpec) -> list[str]:
    """Markdown lines generated from the verdicts: per task which slot changes mattered, and where
    nothing did (variants that compute the reference's function are listed apart, never ranked)."""
    out = ["## Findings", "", "Generated from the verdicts above (slot changes relative to "
           f"`{spec.reference}`; variants that change several slots cannot say which of them mattered).", ""]
    cmp = df[(df["relation"] == "check: different") & (df["verdict"] != "INVALID")]
    same = df[(df["relation"] == SAME) & (df["verdict"] != "INVALID")]
    for task in [t for t in spec.tasks if t in set(df["task"])]:
        g = cmp[cmp["task"] == task]
        parts = []
        for word in ("better", "worse"):
            hits = g[g["verdict"] == word]
            if len(hits):
                parts.append(f"{word}: " + "; ".join(f"{r['variant']} ({r['changed'] or 'no slot change'}, "
                                                    f"{int(r['wins'])}-{int(r['losses'])})" for _, r in hits.iterrows()))
        none = g[~g["verdict"].isin(["better", "worse"])]
        if len(none):
            parts.append(f"no claim: {', '.join(none['variant'])}")
        twins = same[same["task"] == task]
        if len(twins):
            parts.append(f"same function (check): {', '.join(twins['variant'])}")
        out.append(f"- **{task}**: " + (" — ".join(parts) if parts else "nothing compared"))
    slots = _slot_tally(cmp)
    if slots:
        out += ["", "Single-slot changes across tasks:", ""]
        out += [f"- `{k}` alone: " + "; ".join(f"{w} on {', '.join(v[w])}" for w in ("better", "worse", "none") if v[w])
                .replace("none on", "no claim on") for k, v in slots.items()]
    invalid = sorted(set(df[df["verdict"] == "INVALID"]["variant"]))
    if invalid:
        out += ["", f"Not ranked (invalid: a mask leak or broken component): {', '.join(invalid)}."]
    return out + [""]


def _slot_tally(cmp: pd.DataFrame) -> dict[str, dict[str, list[str]]]:
    """single changed slot -> {"better": tasks, "worse": tasks, "none": tasks} (single-slot variants only)."""
    out: dict[str, dict[str, list[str]]] = {}
    for _, r in cmp.iterrows():
        changed = [c for c in str(r["changed"]).split(", ") if c]
        if len(changed) != 1:
            continue
        key = "better" if r["verdict"] == "better" else "worse" if r["verdict"] == "worse" else "none"
        out.setdefault(changed[0], {"better": [], "worse": [], "none": []})[key].append(r["task"])
    return out


def plot_verdicts(df: pd.DataFrame, spec: SuiteSpec, path: Path) -> Path | None:
    """Heat map of P(variant beats the reference) per variant x task, verdicts marked (+ / -)."""
    from ..report.plots import pyplot

    plt = pyplot()
    if plt is None or df.empty:
        return None
    shown = df.assign(p=df["p"].where(df["relation"] != SAME))  # same function: no probability, "="
    table = shown.pivot_table(index="variant", columns="task", values="p", aggfunc="first", dropna=False)
    table = table.reindex(index=list(dict.fromkeys(df["variant"])),
                          columns=[t for t in spec.tasks if t in set(df["task"])])
    fig, ax = plt.subplots(figsize=(1.6 + 1.3 * table.shape[1], 0.8 + 0.42 * table.shape[0]))
    im = ax.imshow(table.to_numpy(float), cmap="RdBu", vmin=0, vmax=1, aspect="auto")
    marks = {(r["variant"], r["task"]): r["verdict"] for _, r in df.iterrows()}
    for i, v in enumerate(table.index):
        for j, t in enumerate(table.columns):
            m = marks.get((v, t), "")
            text = {"better": "+", "worse": "-", "INVALID": "X", "same function": "="}.get(
                m, "ref" if v == spec.reference else "")
            p = table.iat[i, j]
            dark = p == p and abs(p - 0.5) > 0.3  # white on the saturated ends of the colour map
            ax.text(j, i, text, ha="center", va="center", fontsize=12, fontweight="bold",
                    color="white" if dark else "black")
    ax.set_xticks(range(table.shape[1]), table.columns)
    ax.set_yticks(range(table.shape[0]), table.index)
    ax.set_title(f"P(variant beats {spec.reference}) on {spec.metric}; + better, - worse,\n"
                 f"= same function as {spec.reference} (check: differences are rounding)", fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.04)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)
    return path


def tuning_note(df: pd.DataFrame, spec: SuiteSpec) -> list[str]:
    """With ``lr_grid``: how the verdicts were tuned, and each variant's chosen learning rate per task."""
    if not spec.lr_grid:
        return []
    lines = ["## Tuned learning rates", "",
             f"Every task trains each variant at each peak learning rate of {', '.join(f'{v:g}' for v in spec.lr_grid)}; "
             "each variant's is chosen per task on the dev split (best median over seeds, diverged = worst, ties to "
             "the smaller) and every verdict below compares each variant at its own chosen learning rate with "
             f"`{spec.reference}` at its own, on the test split (each task's report.md: \"Learning-rate tuning\").", ""]
    if len(df) and "lr" in df:
        table = df.pivot_table(index="variant", columns="task", values="lr", aggfunc="first")
        table = table.reindex(columns=[t for t in spec.tasks if t in table.columns])
        lrs = {str(v): v for v in spec.lr_grid}
        lines += [_md(table.map(lambda v: "" if pd.isna(v) else lr_cell(v, lrs)).reset_index()),
                  "", "`(edge)`: chosen at the grid's smallest or largest learning rate: that variant's best may lie "
                  "outside the grid, so its verdict may understate it.", ""]
    return lines


def render(df: pd.DataFrame, spec: SuiteSpec, info: dict, env_meta: RunMeta | None) -> str:
    """The whole ``suite.md``. ``info``: command, wall_s, codes, check (see :mod:`harness.suite`)."""
    from ..report import environment_block

    comparisons = int((df["relation"] == "check: different").sum()) if len(df) else 0
    head = [f"# transformer-harness suite `{spec.name}`", "", spec.description, "", "Command:", "", "```",
            info.get("command", ""), "```", "",
            f"Suite wall time: {info.get('wall_s', 0):.0f} s ({info.get('wall_s', 0) / 60:.1f} min) for "
            f"{len(spec.tasks)} task(s) x {df['variant'].nunique() if len(df) else 0} variant(s) x {spec.seeds} "
            f"paired seed(s); per-task exit codes: {info.get('codes', {})}. Each task's own report: "
            + ", ".join(f"[{t}]({t}/report.md)" for t in spec.tasks) + ".", ""]
    if env_meta is not None:
        head += [environment_block(env_meta), ""]
    rule = ["## How the verdicts are made", "", stats.RULE_TEXT, "",
            f"This report makes {comparisons} comparisons with `{spec.reference}` (variants that compute its "
            "function are not compared: `= same function`). The sign test's false-verdict "
            f"rate per comparison of two equal variants is {null_verdict_rate(spec.seeds):.4f} at {spec.seeds} "
            "pairs, with no correction for the number of comparisons: read a single verdict as evidence, a pattern "
            "across tasks as stronger evidence, and the negative control as the check on both.", ""]
    body = classes_section(info.get("check", {})) + tuning_note(df, spec)
    if len(df):
        body += verdict_sections(df, spec) + negative_control(df, spec) + findings(df, spec)
    else:
        body += ["No task stored any trial.", ""]
    return "\n".join(head + body + rule)
