"""``python -m harness decode RUN --variant V --seed S INPUT...``: a saved model on new input."""
from __future__ import annotations

import argparse

DESCRIPTION = """Use the trained model of one trial of a run made with --save-models on new input:
each INPUT is read by the run's task, decoded (greedy, or beam search with --beam K) and written
by the task. g2p: a word's letters in, ARPAbet phonemes out (without stress marks, as the task
scores them). Other tasks: token ids, e.g. '3 4 5'. The model is rebuilt from the run's stored
spec (variant, config, plugins) and its weights file is checked against the SHA-256 the run
recorded. Prints one line per input: the input, a tab, the output."""

EPILOG = """examples:
  python -m harness run --variants baseline --task g2p --preset g2p --save-models --run-id g2p-model
  python -m harness decode g2p-model --variant baseline --seed 0 transformer harness
  python -m harness decode g2p-model --beam 4 pronounce

exit codes: 0 ok, 2 bad input (no such run or trial, a run without --save-models, an input the
            task cannot read)"""


def register(sub, parents):
    p = sub.add_parser("decode", parents=parents, help="run a saved model (run --save-models) on new input",
                       description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", metavar="RUN", help="run folder, run id under --results-dir, or 'latest'")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="what to decode (g2p: words)")
    p.add_argument("--variant", default="baseline", metavar="NAME", help="the trial's variant (default baseline)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="the trial's seed (default 0)")
    p.add_argument("--point", default="", metavar="NAME", help="the trial's sweep point (experiments; default none)")
    p.add_argument("--beam", type=int, default=1, metavar="K", help="beam width (default 1: greedy decoding)")
    p.add_argument("--device", default="cpu", metavar="DEVICE", help="cpu (default) or cuda")
    p.add_argument("--results-dir", default="results", metavar="DIR", help="where runs are stored (default results)")
    p.set_defaults(func=main)


def main(args) -> int:
    from ..api import decode

    outputs = decode(args.run, args.inputs, args.variant, args.seed, beam=args.beam, point=args.point,
                     device=args.device, results_dir=args.results_dir)
    for text, out in zip(args.inputs, outputs):
        print(f"{text}\t{out or '(empty: the model emitted the end symbol first; an under-trained model does)'}")
    return 0
