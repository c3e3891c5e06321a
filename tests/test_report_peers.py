"""``report RUN --peers FOLDER`` (harness.report.peers): a g2p run's reports show the peers of tools/g2p_peers.py
beside its variants, only where the words are the same (same task, same split), refused in one line otherwise."""
from __future__ import annotations

import shutil

import pytest

from .conftest import ROOT, cli_in_process

pytestmark = pytest.mark.xdist_group("g2p")  # one worker loads the lexicons

PEERS = ROOT / "results" / "reference" / "g2p-peers" / "peers.csv"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A 20-step g2p run (hash split) and a copy-task run, each tiny."""
    root = tmp_path_factory.mktemp("peers")
    for run_id, task in (("g2p", "g2p"), ("copy", "copy")):
        res = cli_in_process("run", "--variants", "baseline", "--task", task, "--preset", "tiny", "--set",
                             "train.steps=20", "--results-dir", root, "--run-id", run_id, "--quiet", "--no-check")
        assert res.returncode == 0, res.stderr
    return root


def _peers(folder, split: str):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "peers.csv").write_text(PEERS.read_text().replace(",standard,", f",{split},"))
    return folder


def _copy(runs, run_id, tmp_path):
    return shutil.copytree(runs / run_id, tmp_path / run_id)


def test_the_peers_show_beside_the_variants_and_stay_in_later_reports(runs, tmp_path):
    run = _copy(runs, "g2p", tmp_path)
    res = cli_in_process("report", run, "--peers", _peers(tmp_path / "p", "hash"), "--quiet")
    assert res.returncode == 0, res.stderr
    report = (run / "report.md").read_text()
    section = report.split("## Peers on the same words", 1)[1].split("\n## ", 1)[0]
    assert "| baseline | this run | 1 |" in section
    assert "| phonetisaurus |" in section and "| 27.26 | 6.57 |" in section
    assert "thisown" in section  # the failed peer is shown with its error, not dropped
    assert cli_in_process("report", run, "--quiet").returncode == 0  # re-rendered without --peers: still there
    assert "## Peers on the same words" in (run / "report.md").read_text()
    assert cli_in_process("verify", run).returncode == 0


@pytest.mark.parametrize("case", ["other_split", "other_task", "no_file"])
def test_peers_that_cannot_be_compared_are_one_line_exit_2_and_change_nothing(runs, tmp_path, case):
    run = _copy(runs, "copy" if case == "other_task" else "g2p", tmp_path)
    folder = tmp_path / "empty" if case == "no_file" else _peers(tmp_path / "p", "standard" if case == "other_split"
                                                                  else "hash")
    before = (run / "report.md").read_text()
    res = cli_in_process("report", run, "--peers", folder)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert {"other_split": "different words", "other_task": "peers are g2p peers",
            "no_file": "no peers.csv there"}[case] in res.stderr
    assert not (run / "peers.csv").exists() and (run / "report.md").read_text() == before
