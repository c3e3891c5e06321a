"""``python -m harness check``: which variants compute the same function, and which leak.

Prints the equivalence matrix; :func:`harness.checking.start_check` runs the checks and writes
``results/checks/<run-id>/checks.csv`` and ``checks.md`` (see :mod:`harness.checks` for the recipe
and docs/checks.md for how to read them), as :func:`harness.check` does: check records
live in ``<results-dir>/checks/``, apart from the runs, so a dozen checks do not crowd ``ls results``
and ``report latest`` (docs/running.md).
"""
from __future__ import annotations

import argparse
import dataclasses

from ..checks import CHECK_MODEL, TOLERANCES, render_text, slot_default
from ..config import DEFAULT_PRESET
from ..report.terminal import terminal_width, wrapped_table
from ..request import CheckRequest
from ..store import CHECKS_DIR
from .common import add_output, add_selection, command_line, plugin_spec, preset_notes

#: ``--equivalent`` example: the attention slot's default component and a plugin's (names from the registry)
_EXAMPLE = f"attention={slot_default('attention')},my_attn"

DESCRIPTION = """Check the selected variants against each other and against PyTorch's built-ins:
every pair of variants holding the same canonical parameters (logits at real target positions
and the gradient of every canonical parameter, each variant's error measured against a float64
run of itself), every attention component against torch.nn.MultiheadAttention, encoder-decoder
stacks against torch.nn.Transformer, model probes (causal leak and padded keys in eval and train
mode, prefix-only = whole-target logits), mask components on fully masked rows, tied embeddings,
CPU vs CUDA. First, every component the selected variants use is held to its slot's reference on
its own (docs/components.md), unless its registration declares a difference (differs=) or an
equivalence (equivalent_to=). Only the selected variants and their components are checked
(--all-components: every registered one). The rows: drawn ones (start symbol first, short and as
long as max_len) and 8 that the preset's task draws (the probes run on them, and a pair found equal
on the drawn rows is compared on them again). Faithful-bug variants (selected by name or a 'bug*'
glob) must be flagged, each with its reason. The record (checks.md, checks.csv, config.json) goes
to <results-dir>/checks/<run-id>/."""

EPILOG = f"""examples:
  python -m harness check --variants all                 the built-in variants (exit 0 on a clean clone)
  python -m harness check --variants all,'bug*'          ... and the study notes' bugs, each flagged
  python -m harness check --variants baseline,pre_norm --dtype bf16
  python -m harness --plugin my_attn.py check --variants all,my_variant --equivalent {_EXAMPLE}

exit codes: 0 every result matches its declaration (flagged bugs included),
            1 a component breaks its slot's contract, something declared equivalent differs, a probe
              leaks, or a bug goes unflagged,
            2 bad input"""


def register(sub, parents):
    p = sub.add_parser("check", parents=parents, help="equivalence matrix, PyTorch references, mask probes, bugs",
                       description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_selection(p)
    base = ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(CHECK_MODEL).items())
    p.add_argument("--preset", default=None, metavar="NAME",
                   help=f"take the model config from this preset ({preset_notes()}) instead of the check config. "
                        f"Default: the check config ({base}), not {DEFAULT_PRESET} as elsewhere: small enough that "
                        f"every comparison runs in seconds (the task rows still come from {DEFAULT_PRESET}'s task)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="model.KEY=VALUE",
                   help="override one model value, e.g. --set model.d_model=64 (train.* settings do not apply)")
    p.add_argument("--device", default="auto",
                   help="auto (cuda when present), cpu or cuda: where the comparisons run. Default: auto")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"],
                   help="fp32, or bf16 through torch.autocast; tolerance rows: "
                        + ", ".join(f"{d}/{dev}" for d, dev in TOLERANCES))
    p.add_argument("--seed", type=int, default=0, help="seed of the reference parameters and the batch (default 0)")
    p.add_argument("--equivalent", action="append", default=[], metavar="SLOT=A,B",
                   help="override: treat components of SLOT as numerically equivalent (repeatable), e.g. "
                        f"{_EXAMPLE}. Normally a component declares this itself "
                        "(Component(..., equivalent_to=...), see docs/components.md)")
    p.add_argument("--all-components", action="store_true",
                   help="hold every registered component (installed plugins included) to its slot's reference, "
                        "not only the components the selected variants use")
    p.add_argument("--threads", type=int, default=1, metavar="N",
                   help="torch threads while checking (default 1: probe-sized tensors gain nothing from more, and "
                        "more threads than free cores make check 10-100x slower on a busy machine; 0: torch's default)")
    add_output(p, "check", default_id=f"check-<timestamp>, in <results-dir>/{CHECKS_DIR}/")
    p.set_defaults(func=main)


def request_from_args(args) -> CheckRequest:
    """The :class:`harness.request.CheckRequest` of a parsed ``check`` command line."""
    return CheckRequest(variants=tuple(args.variants), grid=bool(args.grid), preset=args.preset,
                        overrides=tuple(args.overrides), device=args.device, dtype=args.dtype, seed=args.seed,
                        equivalent=tuple(args.equivalent), all_components=args.all_components,
                        plugins=plugin_spec(args), quiet=args.quiet, results_dir=args.results_dir,
                        run_id=args.run_id, command=command_line(), threads=args.threads or None)


def main(args) -> int:
    from ..checking import start_check

    outcome = start_check(request_from_args(args))
    width = terminal_width()
    print(render_text(outcome.report, width, lambda frame: wrapped_table(frame, width), outcome.variants))
    print(f"\nchecks: {outcome.markdown}  {outcome.csv}  ({outcome.report.wall_s:.1f} s)")
    return outcome.exit_code
