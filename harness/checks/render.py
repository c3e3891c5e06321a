"""Rendering a :class:`~harness.checks.report.CheckReport`: the terminal text ``check`` prints, the
``checks.csv`` rows and ``checks.md``: each stage's rows (``*_rows``) and section (``md_*``), which
:mod:`harness.checks.stages` registers, and the parts around them.

Tables are pandas DataFrames rendered by tabulate as GitHub markdown.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Callable, Sequence

from .contract_base import SLOT_REFERENCES
from .inputs import fmt_size
from .pairs import EQUIVALENT, IDENTICAL, NOT_COMPARABLE, ReferenceResult, TensorDiff
from .policy import TOLERANCES
from ..runmeta import RunMeta
from .report import CheckReport

LEGEND = ("identical: bitwise equal logits and gradients; ≈ x: equivalent, largest max|Δ| x within its threshold; "
          "≠ x: differs as declared (x = max|Δ logit| at real target positions); ≈ x (declared ≠): declared "
          "different, measured the same (not a failure); FAIL: does not match the declaration (see the pair table).")


def matrix_frame(report: CheckReport, compact: bool = False):
    """variant x variant table of :meth:`PairResult.cell` texts (pandas DataFrame). ``compact`` (a narrow
    terminal): the variants numbered (row ``k name``, column ``k``) and each cell
    :meth:`PairResult.symbol` (:data:`COMPACT_LEGEND`)."""
    import pandas as pd

    text = (lambda p: p.symbol()) if compact else (lambda p: p.cell())
    cells = {(p.a, p.b): text(p) for p in report.results.get("pairs", [])}
    number = {v: str(i) for i, v in enumerate(report.variants, 1)}
    rows = []
    for a in report.variants:
        row = {"variant": f"{number[a]} {a}" if compact else a}
        for b in report.variants:
            row[number[b] if compact else b] = "—" if a == b else cells.get((a, b)) or cells.get((b, a), "")
        rows.append(row)
    return pd.DataFrame(rows)


#: The matrix on a narrow terminal (``matrix_frame(report, compact=True)``): what each cell means.
COMPACT_LEGEND = ("= identical (bitwise); ≈ equivalent, within its threshold; ≠x differs as declared, x = max|Δ logit| "
                  "(2 significant digits); ≈! declared different, measured the same (not a failure); FAIL does not "
                  "match its declaration; n/a no counterpart. Columns are the rows' numbers; the sizes: checks.md")


def results_frame(report: CheckReport):
    """One row per check result (the ``checks.csv`` layout), stage by stage: section, subject, reference,
    expected, verdict, ok, sizes (max |Δ|, threshold, reference error, float64 difference) and detail."""
    import pandas as pd

    df = pd.DataFrame([row for stage in report.stages for row in stage.rows(report)])
    # pandas would turn the mixed None/float columns into object dtype; keep them numeric
    for c in ("max_abs", "threshold", "ref_error", "float64_diff", "grad_max_abs", "grad_threshold"):
        if c in df:
            df[c] = pd.to_numeric(df[c], errors="coerce")
    return df


def csv_row(section, subject, reference, expected, verdict, ok, main=None, grad=None, detail="", **extra) -> dict:
    """One ``checks.csv`` row; ``main``/``grad``: the :class:`~harness.checks.pairs.TensorDiff` of the
    output and of the gradient closest to its threshold (their sizes fill the size columns)."""
    return {"section": section, "subject": subject, "reference": reference, "expected": expected,
            "verdict": verdict, "ok": ok,
            "max_abs": main.max_abs if main else None, "threshold": main.threshold if main else None,
            "ref_error": main.ref_error if main else None, "float64_diff": main.golden if main else None,
            "grad_max_abs": grad.max_abs if grad else None, "grad_name": grad.name if grad else None,
            "grad_threshold": grad.threshold if grad else None, "detail": detail, **extra}


def component_rows(report: CheckReport) -> list[dict]:
    return [csv_row("component", f"{c.slot}={c.name}", c.check, c.declared, c.verdict, c.ok or c.buggy,
                    detail="; ".join(x for x in (c.diagnosis, c.detail) if x), max_abs=c.max_abs,
                    threshold=c.threshold, plugin=c.plugin) for c in report.components]


def pair_rows(report: CheckReport) -> list[dict]:
    return [csv_row("pair", p.a, p.b, p.expected, p.verdict, p.ok, p.logits, p.grad_max,
                    "; ".join(p.declared + p.notes)) for p in report.pairs]


def probe_rows(report: CheckReport) -> list[dict]:
    return [csv_row("probe", p.subject, f"{p.probe} ({p.mode})", "unchanged", "pass" if p.passed else "leak", p.passed,
                    detail=p.detail, max_abs=p.max_change, threshold=p.threshold) for p in report.probes]


def mask_rows(report: CheckReport) -> list[dict]:
    return [csv_row("mask component", m.component, "reference masked softmax", "equal", "pass" if m.passed else "fail",
                    m.passed or m.buggy, detail=m.detail, max_abs=m.max_error, fully_masked_row=m.fully_masked_row)
            for m in report.masks]


def reference_rows(name: str, section: str):
    """The ``checks.csv`` rows of a stage of :class:`ReferenceResult` s named ``name``, as ``section``."""
    def rows(report: CheckReport) -> list[dict]:
        return [csv_row(section, r.subject, r.reference, r.expected, r.verdict, r.ok or r.buggy, r.output, r.grad_max,
                        r.detail, padded_rows_max_abs=r.padded_rows) for r in report.results[name]]
    return rows


def tie_rows(report: CheckReport) -> list[dict]:
    return [csv_row("tied parameters", t.variant, "construction, .to, load_state_dict", "ties preserved",
                    "pass" if t.passed else "fail", t.passed,
                    detail=t.detail or "; ".join(",".join(g) for g in t.groups),
                    params_unique=t.params_unique, params_per_use=t.params_per_use) for t in report.ties]


def bug_rows(report: CheckReport) -> list[dict]:
    return [csv_row("faithful bug", b.variant, "all checks", "flagged", "flagged" if b.flagged else "NOT flagged",
                    b.flagged, detail=" | ".join(b.reasons)) for b in report.bugs]


def class_text(report: CheckReport, cls: list[str]) -> str:
    """``{a, b}``, and for a variant alone in its class because no other variant can hold its canonical
    parameters (every pair of it not comparable), the reason (:func:`~harness.checks.runs.layout_conflict`)."""
    text = "{" + ", ".join(cls) + "}"
    if len(cls) == 1:
        mine = [p for p in report.results.get("pairs", []) if cls[0] in (p.a, p.b)]
        apart = [p for p in mine if p.verdict == NOT_COMPARABLE]
        if apart and len(apart) == len(mine):  # alone because nothing else can hold its parameters
            text += f": in a class of its own ({apart[0].notes[0].split(' (a component')[0]})"
    return text


def class_summary(report: CheckReport) -> list[dict]:
    """Per equivalence class (and per PyTorch reference): the largest error seen and the tolerance
    it was held to (the pair and tensor closest to its threshold)."""
    out = []
    for cls in report.classes():
        if len(cls) < 2:
            continue
        members = set(cls)
        inside = [p for p in report.results.get("pairs", [])
                  if p.a in members and p.b in members and p.same_function]
        out.append(_summary_row(", ".join(cls), [(f"{p.a} vs {p.b}", p.diffs) for p in inside]))
    for label, name in (("attention components vs nn.MultiheadAttention", "mha"),
                        ("stacks vs nn.Transformer", "transformer"), ("cpu vs cuda", "devices")):
        matched = [(f"{r.subject} / {r.reference}", r.diffs) for r in report.results.get(name, [])
                   if r.verdict in (IDENTICAL, EQUIVALENT) and not r.buggy]
        if matched:
            out.append(_summary_row(label, matched))
    return out


def _summary_row(label: str, items: list[tuple[str, list[TensorDiff]]]) -> dict:
    flat = [(where, d) for where, ds in items for d in ds]
    biggest = max(flat, key=lambda wd: wd[1].max_abs, default=None)
    tightest = max(flat, key=lambda wd: wd[1].ratio, default=None)
    return {"class": label, "comparisons": len(items),
            "largest max|Δ|": fmt_size(biggest[1].max_abs) if biggest else "—",
            "where": f"{biggest[0]}: {biggest[1].name}" if biggest else "—",
            "held to": fmt_size(biggest[1].threshold) if biggest else "—",
            "closest to its threshold": (f"{fmt_size(tightest[1].max_abs)} / {fmt_size(tightest[1].threshold)} "
                                         f"({tightest[0]}: {tightest[1].name})") if tightest else "—"}


def _md(df) -> str:
    """``df`` as a GitHub markdown table (tabulate), ``_no rows_`` when empty."""
    return "_no rows_" if df.empty else df.to_markdown(index=False, tablefmt="github")


def _widest(text: str) -> int:
    return max(map(len, text.splitlines()))


def matrix_blocks(frame, width: int) -> list[str]:
    """The compact matrix ``frame`` (:func:`matrix_frame` with ``compact=True``) as markdown tables no
    wider than ``width`` characters where one column allows it: each block repeats the variant column
    and takes consecutive numbered columns, as few blocks as fit and of even sizes where they still
    fit; with more than one block each is headed ``columns i-j of n``. A single column wider than
    ``width`` still gets a block of its own."""
    first, columns = frame.columns[0], list(frame.columns[1:])
    blocks: list[list] = []
    for col in columns:
        if blocks and _widest(_md(frame[[first, *blocks[-1], col]])) <= width:
            blocks[-1].append(col)
        else:
            blocks.append([col])
    if len(blocks) == 1:
        return [_md(frame)]
    q, r = divmod(len(columns), len(blocks))  # even sizes, e.g. 9+9+8 rather than 12+12+2
    ends = [(i + 1) * q + min(i + 1, r) for i in range(len(blocks))]
    even = [columns[end - q - (i < r):end] for i, end in enumerate(ends)]
    if all(_widest(_md(frame[[first, *b]])) <= width for b in even):
        blocks = even
    return [f"columns {b[0]}-{b[-1]} of {len(columns)}:\n\n" + _md(frame[[first, *b]]) for b in blocks]


#: The classes' table's headers on the terminal, shorter so that it fits 120 columns (checks.md: the long ones).
TERMINAL_HEADERS = {"comparisons": "compared", "largest max|Δ|": "max|Δ|"}


def render_text(report: CheckReport, width: int | None = None, table: Callable | None = None,
                variants: Sequence | None = None) -> str:
    """What ``check`` prints: the matrix, the classes, failures and flagged bugs, then each of the checked
    ``variants`` (:class:`harness.registry.Variant` s) that fails with its fault (:func:`variant_faults`). With ``width`` (the
    ``check`` command: 120) the lines of text are wrapped to it, and the classes' table, with shorter
    headers (:data:`TERMINAL_HEADERS`), is laid out by ``table(frame)`` (the command passes
    :func:`harness.report.terminal.wrapped_table`), and a matrix wider than ``width`` is shown compact
    (``matrix_frame(report, compact=True)``). checks.md keeps everything as it is."""
    import textwrap

    import pandas as pd

    def fill(text: str, first: str = "", rest: str = "") -> str:
        return textwrap.fill(text, width, initial_indent=first, subsequent_indent=rest) if width else first + text

    parts = []
    if report.variants:
        matrix = _md(matrix_frame(report))
        if width and _widest(matrix) > width:  # numbered columns, a symbol a cell, in blocks of columns
            matrix = "\n\n".join(matrix_blocks(matrix_frame(report, compact=True), width))
            legend = COMPACT_LEGEND
        else:
            legend = LEGEND
        parts += [fill("Equivalence matrix (" + f"{report.device}, {report.dtype}; " + legend + ")"), "", matrix, ""]
        parts += ["Equivalence classes:", ""]
        parts += [fill(class_text(report, c), "  ", "    ") for c in report.classes()]
        summary = pd.DataFrame(class_summary(report))
        parts += ["", _md(summary) if table is None or summary.empty else table(summary.rename(columns=TERMINAL_HEADERS)),
                  ""]
    if report.results.get("bugs"):
        parts += ["Faithful-bug variants:", ""]
        for b in report.bugs:
            parts.append(f"  {b.variant}: {'flagged' if b.flagged else 'NOT FLAGGED'}")
            parts += [fill(r, "    - ", "      ") for r in b.reasons[:3]]
        parts.append("")
    fails = report.failures()
    parts.append(f"{len(fails)} result(s) do not match their declaration" + (":" if fails else "."))
    parts += [fill(f, "  - ", "    ") for f in fails]
    faults = variant_faults(report, variants or [])
    if faults:
        parts += ["", f"Failing variants ({len(faults)} of {len(variants)}), each with its first fault:"]
        parts += [fill(f"{name}: {lines[0]}" + (f" (+{len(lines) - 1} more above)" if len(lines) > 1 else ""),
                       "  - ", "    ") for name, lines in faults.items()]
    return "\n".join(parts)


def variant_faults(report: CheckReport, variants: Sequence) -> dict[str, list[str]]:
    """Selected variant -> the failure lines (:meth:`CheckReport.failures`) that concern it, its own
    first: a line concerns a variant when it names it or one of its components as ``slot=component``
    (:attr:`harness.registry.Variant.slots`). A line that concerns several (a pair ``A vs B``) blames
    only those of them with no fault of their own, if any has one (the baseline in a pair with a broken
    plugin variant is not failing). Variants with no fault are left out; their order is kept."""
    import re

    fails = report.failures()
    hits: dict[str, list[str]] = {}
    for v in variants:
        names = [re.escape(v.name)] + [f"{re.escape(s)}={re.escape(c)}" for s, c in v.slots.items()]
        pattern = re.compile(r"(?<![\w.=-])(" + "|".join(names) + r")(?![\w-])")
        hits[v.name] = [f for f in fails if pattern.search(f)]
    shared = {f for f in fails if sum(f in lines for lines in hits.values()) > 1}
    own = {name: [f for f in lines if f not in shared] for name, lines in hits.items()}
    out = {}
    for name, lines in hits.items():
        others = [n for n, ls in hits.items() if n != name and any(f in ls for f in lines if f in shared)]
        if own[name] or (lines and not any(own[n] for n in others)):
            out[name] = own[name] + [f for f in lines if f in shared]
    return out


# --------------------------------------------------------------------------- checks.md, one renderer per section

def render_markdown(report: CheckReport, meta: RunMeta) -> str:
    """``checks.md``: environment, config, tolerance table, then each stage's section in registry order
    (matrix, classes, pairs, probes, ...), then the result."""
    sections = ([_md_environment(report, meta), _md_config(report), _md_tolerances(report)]
                + [stage.markdown(report) for stage in report.stages] + [_md_result(report)])
    return "\n".join(line for section in sections for line in section) + "\n"


def _md_environment(report: CheckReport, meta: RunMeta) -> list[str]:
    env = meta.environment
    parts = [f"# transformer-harness checks `{meta.run_id or ''}`", "",
             "Command:", "", f"```\n{meta.command}\n```", "", "## Environment", ""]
    parts += [f"- {k}: `{v}`" for k, v in env.items() if v is not None]
    return parts + [f"- check dtype: `{report.dtype}`, seed: `{report.seed}`",
                    f"- TF32: {report.tf32}", f"- check wall time: {report.wall_s:.1f} s", ""]


def _md_config(report: CheckReport) -> list[str]:
    return ["## Config", "", f"```json\n{json.dumps(dataclasses.asdict(report.cfg))}\n```", "",
            "Batch: 4 short rows (S=9, T=10, row i ends with i pad tokens) and 2 as long as max_len (up to 66; S = T - 3), "
            "right padding; logits compared at real "
            "target positions, gradients of every canonical parameter (mean cross-entropy against fixed labels). "
            "Every variant holds one reference canonical state (random LayerNorm gains and biases included).", ""]


def _md_tolerances(report: CheckReport) -> list[str]:
    import pandas as pd

    rows = [{"dtype": d, "device": dev, "atol": t.atol, "fudge": t.fudge, "note": t.note,
             "used": "◀" if (d, dev) == (report.dtype, report.device) else ""} for (d, dev), t in TOLERANCES.items()]
    return ["## Tolerances", "",
            "threshold = max(atol, fudge × ref_error), ref_error = max |run − float64 run of the same variant| "
            "(PyTorch test_transformers' recipe). The row used here is marked.", "",
            _md(pd.DataFrame(rows)), ""]


def md_components(report: CheckReport) -> list[str]:
    import pandas as pd

    if not report.components:
        return []
    rows = [{"component": f"{c.slot}={c.name}" + (" [bug]" if c.buggy else ""), "plugin": c.plugin,
             "held to": c.declared, "check": c.check, "verdict": c.verdict, "max|Δ|": fmt_size(c.max_abs),
             "threshold": fmt_size(c.threshold), "diagnosis": c.diagnosis or c.detail} for c in report.components]
    return ["## Components vs their slot's reference", "",
            "Each component on its own, with the harness's reference siblings (docs/components.md). "
            "References: " + "; ".join(f"**{k}**: {v}" for k, v in SLOT_REFERENCES.items()), "",
            _md(pd.DataFrame(rows)), ""]


def md_variants(report: CheckReport) -> list[str]:
    """Matrix, classes, the pair table and the lossy-load notes (nothing without variants)."""
    import pandas as pd

    if not report.variants:
        return []
    parts = ["## Equivalence matrix", "", LEGEND, "", _md(matrix_frame(report)), "", "## Equivalence classes", ""]
    parts += [f"- {class_text(report, c)}" for c in report.classes()]
    parts += ["", "Largest error seen in each class (and per PyTorch reference) and the tolerance it was held to:",
              "", _md(pd.DataFrame(class_summary(report))), "", "## Pairs", ""]
    rows = [{"A": p.a, "B": p.b, "expected": p.expected, "verdict": p.verdict,
             "max|Δ logits|": fmt_size(p.logits.max_abs if p.logits else None),
             "threshold": fmt_size(p.logits.threshold if p.logits else None),
             "float64 Δ": fmt_size(p.logits.golden if p.logits else None),
             "max|Δ grad|": fmt_size(p.grad_max.max_abs if p.grad_max else None),
             "grad": p.grad_max.name if p.grad_max else "", "declared differences": "; ".join(p.declared),
             "notes": "; ".join(p.notes)} for p in report.pairs]
    parts += [_md(pd.DataFrame(rows)), ""]
    notes = [(name, r.notes) for name, r in report.runs.items() if r.notes]
    if notes:
        parts += ["Lossy loads of the reference state (what a variant cannot hold):", ""]
        parts += [f"- {name}: {'; '.join(n[:3])}{' ...' if len(n) > 3 else ''}" for name, n in notes]
        parts.append("")
    return parts


def md_probes(report: CheckReport) -> list[str]:
    import pandas as pd

    rows = [{"variant": p.subject, "probe": p.probe, "mode": p.mode, "result": "pass" if p.passed else "LEAK",
             "max change": fmt_size(p.max_change), "threshold": fmt_size(p.threshold), "detail": p.detail}
            for p in report.probes]
    return ["## Model-level probes", "",
            "Model contract (float32, holding the reference state): logits (B, T, V) finite; every parameter "
            "gets a finite, non-zero gradient; the canonical state round-trips; the same seed builds the same "
            "model. Causal leak: the target tokens after position c change (every c); logits at real positions <= c "
            "must not. Masked source keys: the tokens at padded source positions change, masks kept; logits at "
            "real target positions must not. Train mode re-seeds the RNG before each forward (dropout "
            f"{report.cfg.dropout}), so both forwards drop the same units. Threshold: the variant's own "
            "threshold for its logits.", "", _md(pd.DataFrame(rows)), ""]


def md_masks(report: CheckReport) -> list[str]:
    import pandas as pd

    rows = [{"mask": m.component + (" [bug]" if m.buggy else ""), "padding": "ok" if m.padding_ok else "FAIL",
             "causal": "ok" if m.causal_ok else "FAIL", "max error": fmt_size(m.max_error),
             "fully masked row": m.fully_masked_row, "detail": m.detail} for m in report.masks]
    return ["### Mask components", "",
            "softmax(apply(scores, mask)) vs the reference masked softmax at real query rows; fully masked row: "
            "a source made only of pad tokens.", "", _md(pd.DataFrame(rows)), ""]


def md_mha(report: CheckReport) -> list[str]:
    return ["## Attention components vs torch.nn.MultiheadAttention", "",
            "in_proj_weight = [w_q; w_k; w_v], out_proj = w_o; MHA masks from the ids (bool, True = blocked). "
            "Output compared at real query rows; `padded rows` = max|Δ| at padded query rows (information only: "
            "valid_lens is causal-only there).", "", _md(_reference_rows(report.mha, padded=True)), ""]


def md_transformer(report: CheckReport) -> list[str]:
    return ["## Stacks vs torch.nn.Transformer and nn.TransformerEncoder", "",
            "Same embedded inputs (embeddings, scaling and positional encoding are outside nn.Transformer); "
            "decoder output at real target positions and gradients of every stack parameter. A decoder-only or "
            "prefix-LM stack: nn.TransformerEncoder over the same packed sequence with the same causal or prefix "
            "mask, its output at the real target positions.", "",
            _md(_reference_rows(report.transformer)), ""]


def md_ties(report: CheckReport) -> list[str]:
    import pandas as pd

    rows = [{"variant": t.variant, "tied groups": " | ".join(", ".join(g) for g in t.groups) or "none",
             "params (unique)": t.params_unique, "params (per use)": t.params_per_use,
             "untied counterpart Δ logits / Δ grad": (f"{fmt_size(t.untied_logits)} / {fmt_size(t.untied_grad)}"
                                                      if t.untied_logits is not None else "—"),
             "result": "pass" if t.passed else "FAIL", "detail": t.detail} for t in report.ties]
    return ["## Tied parameters", "", _md(pd.DataFrame(rows)), ""]


def md_devices(report: CheckReport) -> list[str]:
    return ["## CPU vs CUDA", "", _md(_reference_rows(report.devices)), ""]


def md_bugs(report: CheckReport) -> list[str]:
    if not report.bugs:
        return []
    parts = ["## Faithful-bug variants", "", "Reproduced on purpose from the study notes; every one must be flagged.", ""]
    for b in report.bugs:
        parts.append(f"- **{b.variant}** ({b.summary}): {'flagged' if b.flagged else '**NOT flagged**'}")
        parts += [f"  - {r}" for r in b.reasons]
    return parts + [""]


def _md_result(report: CheckReport) -> list[str]:
    fails = report.failures()
    return ["## Result", "", f"{len(fails)} result(s) do not match their declaration."] + [f"- {f}" for f in fails]


def _reference_rows(items: list[ReferenceResult], padded: bool = False):
    import pandas as pd

    rows = []
    for r in items:
        row = {"subject": r.subject + (" [bug]" if r.buggy else ""), "reference": r.reference, "verdict": r.verdict,
               "max|Δ out|": fmt_size(r.output.max_abs if r.output else None),
               "threshold": fmt_size(r.output.threshold if r.output else None),
               "max|Δ grad|": fmt_size(r.grad_max.max_abs if r.grad_max else None),
               "grad": r.grad_max.name if r.grad_max else ""}
        if padded:
            row["padded rows"] = fmt_size(r.padded_rows)
        row["detail"] = r.detail
        rows.append(row)
    return pd.DataFrame(rows)
