"""``python -m harness experiments``: list the declarative experiments (experiments/*.toml)."""
from __future__ import annotations

import sys
import textwrap

import pandas as pd

from ..errors import HarnessError
from ..report.terminal import WIDTH

DESCRIPTION = """List the experiments found in ./experiments and in the repository's experiments/
folder (a name in ./experiments hides the repository's): name, description, kind, variants,
seeds, sweep points and the number of trials. Run one with:
python -m harness run --experiment NAME. A malformed file is reported on stderr (exit 2)."""


def register(sub, parents):
    p = sub.add_parser("experiments", parents=parents, help="list the declarative experiments",
                       description=DESCRIPTION)
    p.add_argument("name", nargs="?", metavar="NAME", help="show one experiment's sweep points (name or .toml path)")
    p.set_defaults(func=main)


def main(args) -> int:
    from .. import experiments as ex
    from ..report import lr_max
    from .common import load_registry

    reg = load_registry(args)
    if args.name:
        exp = ex.load_experiment(ex.find_experiment(args.name))
        n = ex.n_trials(exp, reg)
        print(f"{exp.name}: {exp.description}\nfile: {exp.path}\nkind: {exp.kind}; preset: {exp.preset}; "
              f"variants: {', '.join(exp.variants)}; seeds: {list(exp.seeds)}; trials: {n}")
        if exp.source:
            print(f"source: {exp.source}")
        rows = [{"point": name or "(no sweep)", **{k: v for k, v in _flat(cfg.to_dict()).items()
                                                   if k in dict(exp.sweep)}, "lr_max": f"{lr_max(cfg.to_dict()):.3g}"}
                for name, cfg in exp.points()]
        print()
        print(pd.DataFrame(rows).to_markdown(index=False, tablefmt="github"))
        return 0
    rows, errors = [], []
    for name, path in ex.experiment_files().items():
        try:
            exp = ex.load_experiment(path)
        except HarnessError as exc:
            errors.append(str(exc))
            continue
        n = ex.n_trials(exp, reg)
        trials = f"{n} trials" if n is not None else "? trials (an unknown variant)"
        rows.append(f"{exp.name} ({exp.kind}: {len(exp.variants)} variants x {len(exp.seeds)} seeds x "
                    f"{exp.n_points} point(s) = {trials})\n"
                    + textwrap.fill(exp.description, WIDTH, initial_indent="    ", subsequent_indent="    ") + "\n"
                    + textwrap.fill("variants: " + ", ".join(exp.variants), WIDTH, initial_indent="    ",
                                    subsequent_indent="        "))
    if rows:
        print("\n\n".join(rows))
        print("\nrun one with: python -m harness run --experiment NAME; its plan: python -m harness experiments NAME")
    else:
        dirs = ", ".join(str(d) for d in ex.experiment_dirs())
        print(f"no experiments found in {dirs}" if dirs else "no experiments/ folder here or in the repository")
    for e in errors:
        print(f"harness: error: {e}", file=sys.stderr)
    return 2 if errors else 0


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
