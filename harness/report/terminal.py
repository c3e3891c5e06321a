"""The results table as the terminal shows it: at most :data:`WIDTH` characters wide.

``report.md`` keeps the main table's every column (:func:`harness.report.summary_table`); the
terminal shows the columns a reader decides on (variant, held-out CE, exact-match, WER/PER,
P(> baseline), verdict) and drops the others in a fixed order, then shortens the verdict, until
the table fits. A column whose cells carry no interval (one seed) loses its ``[95% CI]`` header.
"""
from __future__ import annotations

import re
import shutil

import pandas as pd

from .tables import text_cells

#: Characters a terminal line may take at most (the width of a plain 120-column terminal); a
#: narrower terminal gets its own width (:func:`terminal_width`).
WIDTH = 120

#: The narrowest width the tables are fitted to, whatever the terminal says.
MIN_WIDTH = 40


def terminal_width() -> int:
    """The width the terminal output is fitted to: the terminal's columns (``shutil.get_terminal_size``:
    the ``COLUMNS`` environment variable, else the terminal's size, else :data:`WIDTH`) within
    [:data:`MIN_WIDTH`, :data:`WIDTH`]."""
    return max(MIN_WIDTH, min(WIDTH, shutil.get_terminal_size((WIDTH, 24)).columns))

#: Main-table header -> the terminal's shorter header; columns not named here are kept as they are,
#: but for " IQM" dropped from every metric's "... IQM [95% CI]" header (a task's own metrics included).
SHORT = {
    "steps to EM≥0.99 median [IQR]": "steps to EM≥0.99 [IQR]",
    "diverged x/n [Wilson 95%]": "diverged",
}

#: Columns the terminal never shows (report.md has them).
REPORT_ONLY = ("tokens/s", "time to EM≥0.99 s (median)", "early loss (mean ± std)",
               "mean held-out CE over training IQM [95% CI]")

#: Columns dropped one by one, first to last, while the table is too wide (header prefixes);
#: exact-match only where WER is shown (on g2p exact-match is 1 - WER). Never ``point``: with a sweep
#: it tells a variant's rows apart, as ``variant`` does.
DROP_ORDER = ("steps to EM≥0.99", "params", "step ms", "diverged", "exact-match")

#: Dropped after the verdicts lose their reasons, if the table is still too wide.
LAST_DROPS = ("PER", "P(>")

#: The verdict column is cut to no fewer than this many characters before ``LAST_DROPS[-1]`` goes.
MIN_VERDICT = 24

#: A verdict's trailing parenthesis longer than this is left to report.md ("(needs >= 6 untied
#: pairs without a loss)"); a short one, the test's numbers ("(sign test 6-0, p = 0.031)"), stays
#: while the table fits.
MAX_PAREN = 28


def _width(df: pd.DataFrame) -> int:
    return max(len(line) for line in _markdown(df).splitlines())


def _markdown(df: pd.DataFrame) -> str:
    return df.to_markdown(index=False, tablefmt="github", **text_cells(df))


def _clip(text: str, n: int) -> str:
    text = str(text)
    return text if len(text) <= n else text[: n - 1].rstrip() + "…"


def _short_verdict(text: str, longest: int = MAX_PAREN) -> str:
    """The verdict without a trailing parenthesis longer than ``longest`` characters
    ("same function (check: = baseline; ...)" -> "same function")."""
    m = re.match(r"^(.*\S)\s*(\([^()]*\))$", str(text))
    return m.group(1) if m and len(m.group(2)) > longest else str(text)


def _headers(df: pd.DataFrame) -> pd.DataFrame:
    """Shorter headers; an interval tag dropped from a column none of whose cells has an interval."""
    df = df.rename(columns=SHORT).rename(columns=lambda c: re.sub(r" IQM (\[95% CI\])$", r" \1", str(c)))
    renamed = {}
    for col in df.columns:
        if re.search(r"\[(95% CI|IQR)\]", str(col)) and not df[col].astype(str).str.contains(r"\[").any():
            renamed[col] = re.sub(r"\s*\[(95% CI|IQR)\]", "", str(col))
    return df.rename(columns=renamed)


def _droppable(df: pd.DataFrame, prefix: str) -> list[str]:
    if prefix == "exact-match" and not any(str(c).startswith("WER") for c in df.columns):
        return []
    return [c for c in df.columns if str(c).startswith(prefix)]


def _fit_verdict(df: pd.DataFrame, full: pd.Series, width: int, least: int) -> pd.DataFrame:
    """``df`` with its verdicts cut from ``full`` to fit ``width`` (to no fewer than ``least``)."""
    out = df.assign(verdict=full)
    if _width(out) > width:
        keep = max(least, int(full.astype(str).str.len().max()) - (_width(out) - width))
        out["verdict"] = full.map(lambda v: _clip(v, keep))
    return out


def _drop(df: pd.DataFrame, prefixes, width: int) -> pd.DataFrame:
    for prefix in prefixes:
        if _width(df) <= width:
            break
        df = df.drop(columns=_droppable(df, prefix))
    return df


def terminal_table(table: pd.DataFrame, width: int | None = None) -> str:
    """``table`` (the report's main table, or any string table) as GitHub markdown at most
    ``width`` characters wide (default :func:`terminal_width`) where it can be (a single column
    wider than ``width`` cannot).

    Reductions, in order, until it fits: report-only columns out, interval tags off columns with
    no interval, long verdict reasons out, :data:`DROP_ORDER`, every verdict reason out,
    :data:`LAST_DROPS` (the verdict cut to :data:`MIN_VERDICT` characters before the last). On a
    terminal narrower than :data:`WIDTH` the verdicts are wrapped onto more lines instead of cut
    (:func:`wrapped_table`), and ``P(>`` goes only when the wrapped table is still too wide.

    Returns:
        The table, then a line pointing to report.md when anything was left out.
    """
    if table.empty:
        return "_no rows_"
    width = terminal_width() if width is None else width
    df = _headers(table.drop(columns=[c for c in REPORT_ONLY if c in table.columns]))
    if "diverged" in df and df["diverged"].astype(str).str.match(r"^0/\d+").all():
        df = df.drop(columns=["diverged"])  # nothing diverged: the column says nothing
    if "verdict" in df:
        df["verdict"] = df["verdict"].map(_short_verdict)
    df = _drop(df, DROP_ORDER, width)
    if "verdict" in df and _width(df) > width:
        df["verdict"] = df["verdict"].map(lambda v: _short_verdict(v, 0))
    df = _drop(df, LAST_DROPS[:-1], width)
    if "verdict" in df and width < WIDTH:
        shown, df = _wrapped(df, width)
    else:
        if "verdict" in df:
            full = df["verdict"]
            if _width(_fit_verdict(df, full, width, MIN_VERDICT)) > width:
                df = _drop(df, LAST_DROPS[-1:], width)
            df = _fit_verdict(df, full, width, 8)
        shown = _markdown(df)
    more = len(table.columns) - len(df.columns)
    cut = "verdict" in df and not df["verdict"].equals(table["verdict"])
    if more or cut:
        what = [f"{more} more column(s)"] * bool(more) + ["the verdicts' reasons"] * cut
        shown += f"\n({' and '.join(what)}: report.md)"
    return shown


def _wrapped(df: pd.DataFrame, width: int) -> tuple[str, pd.DataFrame]:
    """(``df`` with its long cells wrapped to ``width`` by :func:`wrapped_table`, the columns shown): its
    ``P(>`` column is left out when the wrapped table is still too wide."""
    def wrap(d: pd.DataFrame) -> str:
        return wrapped_table(d, width, keep=("variant", "point"), wrap_headers=True)

    shown = wrap(df)
    if max(map(len, shown.splitlines())) > width:
        df = df.drop(columns=_droppable(df, LAST_DROPS[-1]))
        shown = wrap(df)
    return shown, df


#: The narrowest a wrapped column is made (or its header's or longest word's width, if wider) by
#: :func:`wrapped_table`.
MIN_WRAP = 12

#: A word longer than this may be broken by :func:`wrapped_table` (a path, a formula without spaces).
MAX_WORD = 24


def wrapped_table(df: pd.DataFrame, width: int = WIDTH, floatfmt: str = "g", keep: tuple = (),
                  wrap_headers: bool = False) -> str:
    """``df`` as GitHub markdown at most ``width`` characters wide where it can be: its widest columns
    are wrapped at word boundaries (more lines per row), each giving up the same share of what it has
    beyond its floor: its header, its longest word (up to :data:`MAX_WORD` characters) or
    :data:`MIN_WRAP`, whichever is widest (where those floors alone are wider than ``width``, the
    widest word floors give way first, a long word then broken across lines). Nothing is dropped.
    For tables of text (``list``); numbers are printed with ``floatfmt`` (tabulate's, e.g. ``.3f``).
    The columns named in ``keep`` are never wrapped (a variant's name); ``wrap_headers``: a header may
    wrap too (its longest word is then its floor)."""
    if df.empty:
        return "_no rows_"
    cells = df.astype(str)
    natural = [max(len(str(c)), int(cells[c].str.len().max())) for c in df.columns]
    word = [min(MAX_WORD, int(cells[c].str.split().map(lambda ws: max(map(len, ws), default=0)).max()))
            for c in df.columns]
    head = [max(map(len, str(c).split())) if wrap_headers else len(str(c)) for c in df.columns]
    floor = [n if c in keep else min(n, max(h, MIN_WRAP, w)) for n, c, h, w in zip(natural, df.columns, head, word)]
    budget = width - (3 * len(natural) + 1)  # "| " + " |" around each cell, one "|" shared between two
    least = [n if c in keep else min(n, max(h, MIN_WRAP)) for n, c, h in zip(natural, df.columns, head)]
    while sum(floor) > budget and any(f > m for f, m in zip(floor, least)):  # the long words cannot all stay whole
        i = max(range(len(floor)), key=lambda j: (floor[j] - least[j], -j))
        floor[i] -= 1
    while True:
        widths = [w if w < n else None for w, n in zip(_shares(natural, floor, budget), natural)]
        text = cells.to_markdown(index=False, tablefmt="github", floatfmt=floatfmt, **text_cells(df),
                                 maxcolwidths=widths, maxheadercolwidths=widths if wrap_headers else None)
        over = max(len(line) for line in text.splitlines()) - width
        if over <= 0 or budget <= sum(floor):
            return text
        budget -= over  # a wrapped word or the padding took more than planned: plan narrower


def _shares(natural: list[int], floor: list[int], budget: int) -> list[int]:
    """Column widths summing to ``budget`` where they can: each column keeps its ``floor`` and the
    same fraction of the rest of its ``natural`` width (a long column keeps more than a short one)."""
    spare = sum(natural) - sum(floor)
    if sum(natural) <= budget or spare <= 0:
        return list(natural)
    r = max(0.0, (budget - sum(floor)) / spare)
    return [f + int((n - f) * r) for n, f in zip(natural, floor)]


def compare_text(table: pd.DataFrame, width: int = WIDTH) -> str:
    """``compare``'s table on the terminal: each row's ``note`` replaced by a reference ``[k]`` to the
    distinct notes listed under the table, one unwrapped line each (with one seed every row shares
    "the paired CI needs >= 3"), and the table wrapped to ``width`` (:func:`wrapped_table`). The
    table with every note in its row: :attr:`harness.report.compare.CompareOutcome.table`."""
    if table.empty or "note" not in table:
        return wrapped_table(table, width)
    text = table["note"].fillna("").astype(str)
    notes = list(dict.fromkeys(n for n in text if n))
    ref = {n: f"[{i}]" for i, n in enumerate(notes, 1)}
    shown = wrapped_table(table.assign(note=text.map(lambda n: ref.get(n, ""))), width)
    return shown + ("\n\n" + "\n".join(f"{ref[n]} {n}" for n in notes) if notes else "")


def narrowed_table(df: pd.DataFrame, drop_order, where: str, width: int = WIDTH) -> str:
    """``df`` (a table of numbers, which wrapping would not help) as GitHub markdown, the columns named
    by ``drop_order`` (header prefixes) left out one by one, first to last, while it is wider than
    ``width`` (:func:`_drop`, as :func:`terminal_table` does); then a line naming how many went to
    ``where`` (the file that keeps them all)."""
    shown = _drop(df, drop_order, width)
    more = len(df.columns) - len(shown.columns)
    return _markdown(shown) + (f"\n({more} more column(s): {where})" if more else "")
