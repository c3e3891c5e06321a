"""What the terminal shows fits the terminal: the results table and the per-trial lines at 80 and 120
columns (``COLUMNS``), and every table prints each metric column with the digits its formatter gave."""
import re

import pytest

from harness.report import summary_table, terminal_table, to_markdown, trials_frame, write_report
from harness.report.terminal import WIDTH, _short_verdict, terminal_width
from harness.runner import trial_line

from .test_report_compare import make_run

NAMES = ["baseline", "additive_mask", "d2l_attention", "pre_norm", "shared_embeddings", "torch_attention",
         "seed_000", "seed_001", "seed_002", "seed_003", "seed_004"]


def _words(text: str) -> list[str]:
    return re.findall(r"[\w.=<>-]+", text)


@pytest.mark.parametrize("columns", [80, 120])
def test_the_results_table_fits_the_terminal_and_wraps_rather_than_cuts_at_80(tmp_path, monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", str(columns))
    assert terminal_width() == columns
    for seeds in (1, 8):
        store = make_run(tmp_path, f"w{seeds}", {n: (0.5 - 0.01 * i, 0.99, ()) for i, n in enumerate(NAMES)},
                         seeds=seeds)
        table = summary_table(trials_frame(store))
        shown = terminal_table(table)
        assert max(map(len, shown.splitlines())) <= columns, shown
        assert all(n in shown for n in NAMES) and "verdict" in shown and "held-out CE" in shown
        if columns == 120:
            assert shown == terminal_table(table, WIDTH)  # the 120-column look is what it was
        else:
            assert "…" not in shown  # wrapped onto more lines, never cut
            for verdict in table["verdict"]:  # each whole, at least without its parenthesis
                assert all(w in shown for w in _words(_short_verdict(verdict, 0))), (verdict, shown)


def test_a_terminal_narrower_than_40_columns_gets_40_and_the_names_stay_whole(tmp_path, monkeypatch):
    """Below 80 columns the table narrows as far as its cells allow (a variant's name is never wrapped)."""
    store = make_run(tmp_path, "n", {n: (0.5 - 0.01 * i, 0.99, ()) for i, n in enumerate(NAMES[:3])}, seeds=8)
    table = summary_table(trials_frame(store))
    monkeypatch.setenv("COLUMNS", "10")
    assert terminal_width() == 40
    shown = terminal_table(table)
    assert shown == terminal_table(table, 40) and "verdict" in shown.splitlines()[0]
    assert max(map(len, shown.splitlines())) < max(map(len, terminal_table(table, 80).splitlines())) <= 80
    names = [ln.strip("|").split("|")[0].strip() for ln in shown.splitlines()[3:] if ln.startswith("|")]
    assert [n for n in names if n] == NAMES[:3]


def test_per_trial_lines_fit_the_width_and_keep_what_they_say():
    row = {"variant": "a_plugin_variant_with_a_rather_long_name", "seed": 3, "status": "invalid",
           "exact_match": 0.5, "wall_s": 12.25, "point": "d_model=256",
           "reason": "at initialisation: decoder position 0 changed (max |Δ logit| 0.3) when later target tokens changed"}
    path = "/a/very/long/checkout/path/results/2026-11-28T03-00-00/trials/a_plugin_variant_with_a_rather_long_name__s3.json"
    whole = trial_line(row, path, 7, 12, 64.0)
    assert len(whole) > 120 and whole.endswith(f"-> stored in {path}")  # no width: as it always was
    for width in (80, 120):
        lines = trial_line(row, path, 7, 12, 64.0, width).splitlines()
        assert max(map(len, lines)) <= width and len(lines) > 1
        assert all(ln.startswith("    ") for ln in lines[1:]) and not lines[0].startswith(" ")
        text = " ".join(ln.strip() for ln in lines)
        assert text.startswith("[7/12 64 s] a_plugin_variant_with_a_rather_long_name [d_model=256] seed 3: invalid "
                               "exact-match 0.500 in 12.2 s (at initialisation:") and "when later target tokens changed)" in text
        assert text.endswith("-> stored in trials/a_plugin_variant_with_a_rather_long_name__s3.json")
    short = {"variant": "baseline", "seed": 0, "status": "ok", "exact_match": 1.0, "wall_s": 0.7}
    assert trial_line(short, "results/r1/trials/baseline__s0.json", 1, 2, 1.0, 120) == \
        "[1/2 1 s] baseline seed 0: ok exact-match 1.000 in 0.7 s -> stored in results/r1/trials/baseline__s0.json"


def test_a_metric_column_keeps_its_digits_an_exact_1_is_printed_as_1_000(tmp_path):
    """tabulate reads a text cell "1.000" as the number 1 and prints ``1`` beside ``0.999``: every
    table (report.md's and the terminal's) prints the cells as formatted."""
    store = make_run(tmp_path, "d", {"baseline": (0.5, 2.0, ()), "pre_norm": (0.4, 0.999, ())}, seeds=1,
                     spread=0.0)
    table = summary_table(trials_frame(store))
    assert list(table["exact-match IQM [95% CI]"]) == ["1.000", "0.999"]
    report = write_report(store).read_text()
    for text in (to_markdown(table), terminal_table(table), report.split("## Results", 1)[1]):
        lines = [ln for ln in text.splitlines() if ln.startswith("|")]
        header = [c.strip() for c in lines[0].strip("|").split("|")]
        rows = {r[0]: dict(zip(header, r)) for r in ([c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:])}
        em = next(h for h in header if h.startswith("exact-match"))
        assert (rows["baseline"][em], rows["pre_norm"][em]) == ("1.000", "0.999"), text
        shown = [col for col in ("step ms", "held-out CE") if any(h.startswith(col) for h in header)]
        assert "held-out CE" in shown and ("step ms" in shown or text == terminal_table(table))
        for col in shown:
            cells = [r[c] for r in rows.values() for c in r if c.startswith(col)]
            assert cells and all(re.fullmatch(r"\d+\.\d+", c) for c in cells), (col, cells)
            assert len({len(c.split(".")[1]) for c in cells}) == 1  # one number of decimals per column
    lines = to_markdown(table).splitlines()
    em = [ln.split("|")[list(table.columns).index("exact-match IQM [95% CI]") + 1] for ln in lines[2:]]
    assert len({len(c) for c in em}) == 1 and all(c.endswith(" ") and c[-2].isdigit() for c in em)  # right-aligned
