"""Peers beside a g2p run's variants: a run folder may hold ``peers.csv`` (written by ``tools/g2p_peers.py``:
Phonetisaurus, Sequitur G2P, trained on the same split's training words and scored by the harness's own WER/PER
on its test words; docs/tasks.md, "Peers on the same words"), put there by ``report RUN --peers FOLDER``
(:func:`attach_peers`); every report of the run then shows the peer rows beside the variants' (:func:`peer_sections`).
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ..config import RunConfig
from ..errors import ConfigError
from ..store import RunStore, atomic_write_text
from .writer import ReportContext, Section

#: The peers' table in a run folder.
PEERS_FILE = "peers.csv"
#: Columns ``peers.csv`` must hold.
PEER_COLUMNS = ("peer", "version", "options", "split", "test_words", "wer", "per", "train_s", "status")


def _split_of(meta) -> str:
    """The run's ``task.split`` as its config reads (the default where a run predates the option)."""
    return RunConfig.from_dict(meta.config).task.split


def attach_peers(store: RunStore, folder: str | Path) -> Path:
    """Copy ``folder``'s ``peers.csv`` into the run ``store`` (atomically), for its reports to show.

    Raises:
        ConfigError: no ``peers.csv`` there (or one without :data:`PEER_COLUMNS`), the run is not a g2p run, or the
            peers were scored on another split than the run's ``task.split`` (different test words: no comparison).
    """
    path = Path(folder) / PEERS_FILE
    if not path.is_file():
        raise ConfigError(f"--peers {folder}: no {PEERS_FILE} there (make one with: python tools/g2p_peers.py "
                          f"--out {folder})")
    peers = pd.read_csv(path)
    missing = [c for c in PEER_COLUMNS if c not in peers.columns]
    if missing:
        raise ConfigError(f"--peers {folder}: {PEERS_FILE} lacks the column(s) {', '.join(missing)}: not written by "
                          "tools/g2p_peers.py")
    meta = store.meta()
    task = RunConfig.from_dict(meta.config).train.task
    if task != "g2p":
        raise ConfigError(f"--peers: run {store.root.name} trained the {task!r} task; peers are g2p peers")
    splits, split = sorted(set(peers["split"].astype(str))), _split_of(meta)
    if splits != [split]:
        raise ConfigError(f"--peers: the peers were scored on the {'/'.join(splits)} split's test words, run "
                          f"{store.root.name} on the {split} split's: different words, no comparison (run "
                          f"tools/g2p_peers.py --split {split})")
    out = store.root / PEERS_FILE
    atomic_write_text(out, path.read_text())
    return out


def _pct(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * float(x):.2f}"


def peers_lines(ctx: ReportContext) -> list[str]:
    """The report section: each variant's mean test WER and PER over its ``ok`` seeds, then each peer's row."""
    peers = pd.read_csv(ctx.store.root / PEERS_FILE)
    df = ctx.df  # the run's trials frame, as the main table reads it
    lines = ["## Peers on the same words", "",
             f"Test WER and PER (%) on the {_split_of(ctx.meta)} split's test words: this run's variants (mean over "
             "their `ok` seeds, greedy or beam as the run decoded) and other G2P systems trained on the same training "
             f"words and scored by the same scorer (`{PEERS_FILE}`, made by `tools/g2p_peers.py`; docs/tasks.md).", "",
             "| system | what | seeds | WER % | PER % | training s |", "|---|---|---|---|---|---|"]
    ok = df[df["status"] == "ok"] if "status" in df and "wer" in df else df.iloc[0:0]
    for variant, g in ok.groupby("variant", sort=False):
        lines.append(f"| {variant} | this run | {len(g)} | {_pct(g['wer'].mean())} | {_pct(g['per'].mean())} | "
                     f"{g['train_s'].mean():.0f} |")
    for _, p in peers.iterrows():
        what = f"{p['peer']} {p['version']}: {p['options']}"
        if p["status"] != "ok":
            what += f" ({p['status']}: {p.get('error', '')})"
        train = "-" if pd.isna(p["train_s"]) else f"{float(p['train_s']):.0f}"
        lines.append(f"| {p['peer']} | {what} | - | {_pct(p['wer'])} | {_pct(p['per'])} | {train} |")
    return lines + [""]


def peer_sections(store: RunStore) -> list[Section]:
    """The run's peers section after its results, when it holds ``peers.csv``; else none."""
    return [Section("after_results", peers_lines)] if (store.root / PEERS_FILE).is_file() else []
