"""``python -m harness run``: train variants x seeds on a task (``--task``, default copy) and write a report.

Every finished trial is stored at once and atomically under ``results/<run-id>/trials/``, so a
run killed at any moment loses no finished trial; ``--resume results/<run-id>`` runs only the
missing ones. ``--jobs N`` runs trials in N local worker processes, ``--executor ray`` on a Ray
cluster (see :mod:`harness.executors` and docs/running.md).

Exit codes: 0 every trial ok; 1 some trial failed, diverged or timed out (the report lists them), the
``--time-budget`` was spent, or a file of the run could not be written (a full disk: one line);
2 bad input (one line on stderr, nothing stored is touched); 130 interrupted by Ctrl-C or
SIGTERM (the message says how to resume).
"""
from __future__ import annotations

import argparse
import sys


from ..request import RunOutcome, RunRequest, Terminated
from ..runmeta import CAPTURE, EXECUTORS, OLD_VECTORISE_FLAG, VECTORISE
from .common import add_config, add_output, add_selection, command_line, plugin_spec

DESCRIPTION = """Train every selected variant on a task (--task, default copy) with one shared loop, store each
trial the moment it finishes under results/<run-id>/ (trials/, trials.csv, curves.csv,
config.json) and print the comparison table (also in report.md). An interrupted or killed run
continues with --resume results/<run-id> (add --retry-failed to run its failed trials again)."""

EPILOG = """examples:
  python -m harness run --variants all --preset tiny -q
  python -m harness run --variants baseline 'seed_*' --seeds 5 --jobs 2
  python -m harness run --variants baseline --preset g2p --seeds 16 --device cuda --vectorise-seeds on
  python -m harness run --variants baseline pre_norm --task reverse
  python -m harness run --resume results/20250101-120000        only the missing trials
  python -m harness run --resume results/20250101-120000 --retry-failed   ... and the failed ones
  python -m harness run --executor ray --address ray://head:10001
  python -m harness run --variants baseline --task g2p --save-models --tensorboard runs/tb

exit codes: 0 all trials ok, 1 a trial failed, diverged or timed out, the time budget was spent or the
run's files could not be written (resume it), 2 bad input, 130 interrupted"""

#: Options left None by the parser, so that a request can tell "given" from "not given".
UNSET_OPTIONS = ("variants", "preset", "seeds", "seed_start", "device", "dtype", "executor", "jobs", "vectorise_seeds",
                 "capture")


def lr_grid_arg(text: str) -> tuple[float, ...]:
    """``--lr-grid 3e-4,1e-3,3e-3`` -> (0.0003, 0.001, 0.003) (argparse turns the ValueError into exit 2)."""
    try:
        return tuple(float(v) for v in text.replace(" ", ",").split(",") if v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected learning rates separated by commas, e.g. 3e-4,1e-3, got {text!r}")


def register(sub, parents):
    p = sub.add_parser("run", parents=parents, help="train variants on a task (default copy) and write a report",
                       description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_selection(p)
    add_config(p)
    p.add_argument("--experiment", metavar="NAME", default=None,
                   help="run a declarative experiment from experiments/NAME.toml (see: python -m harness experiments)")
    p.add_argument("--no-check", dest="check", action="store_false",
                   help="do not check which variants compute the same function before training (a few "
                        "seconds; on a GPU it runs beside the trials); the report then opens without that "
                        "section")
    p.add_argument("--suite", nargs="?", const="default", default=None, metavar="NAME",
                   help="run the suite experiments/suites/NAME.toml (default: default): every variant it names "
                        "on every task it names with paired seeds, one report with verdicts (suite.md)")
    p.add_argument("--baseline", metavar="VARIANT", default=None,
                   help="the variant the others are compared with, recorded in config.json (default: the "
                        "variant named baseline; a run without one must choose)")
    p.add_argument("--seeds", type=int, metavar="N", help="seeds per variant: 0..N-1 (default 1)")
    p.add_argument("--lr-grid", type=lr_grid_arg, metavar="LR[,LR...]", default=None,
                   help="train every variant at each peak learning rate (train.lr; needs a schedule other than "
                        "noam, e.g. --set train.schedule=cosine): each variant's learning rate is chosen on dev "
                        "and the report adds the tuned verdict, the learning-rate sensitivity and its figure")
    p.add_argument("--seed-start", type=int, metavar="S", help="first seed (default 0)")
    add_output(p, "run", what="run", default_id="a timestamp",
               quiet_help="no progress bars or per-trial log lines (bars are off anyway when stderr is not a terminal)")
    add_kept(p)
    add_execution(p)
    p.set_defaults(func=main, **{k: None for k in UNSET_OPTIONS})


def add_kept(p) -> None:
    """``run``'s options for what a run keeps beside its trials (events, MLflow runs, weights)."""
    o = p.add_argument_group("what else a run keeps")
    o.add_argument("--tensorboard", nargs="?", const="", default=None, metavar="DIR",
                   help="write every trial's curves as it trains (training loss, learning rate, held-out CE, "
                        "exact-match, WER/PER) and final metrics with its variant, seed and config as hparams, as TensorBoard "
                        "events: under RUN_DIR/tensorboard/, or DIR/<run-id>/ when DIR is given; view with "
                        "tensorboard --logdir DIR (needs: pip install tensorboard)")
    o.add_argument("--mlflow", nargs="?", const="", default=None, metavar="URI",
                   help="log every trial to MLflow as it trains (the metrics of --tensorboard, the config as params), "
                        "one MLflow run per trial, at URI or in a file store RUN_DIR/mlruns (needs: pip install -e '.[mlflow]')")
    o.add_argument("--save-models", action="store_true",
                   help="keep each trial's final weights as RUN_DIR/models/<variant>__s<seed>.pt (state_dict; "
                        "SHA-256 in the trial file, checked by verify); use them with harness.load_model or "
                        "python -m harness decode")
    o.add_argument("--keep-checkpoints", action="store_true",
                   help="keep each trial's mid-trial checkpoint (RUN_DIR/checkpoints/<key>.pt, written every "
                        "train.checkpoint_every, 60s by default; a vectorised group's: <variant>__group.pt) after "
                        "the trial is stored; by default it is removed")


def add_execution(p) -> None:
    """``run``'s options for resuming and for where and how the trials execute."""
    g = p.add_argument_group("resume and execution")
    g.add_argument("--resume", metavar="RUN_DIR", default=None,
                   help="continue the run stored in RUN_DIR (results/<run-id>): run only its missing trials; "
                        "refused when the config differs from the stored one")
    g.add_argument("--retry-failed", action="store_true",
                   help="with --resume: also run the failed and diverged trials again (their old files are kept "
                        "under RUN_DIR/trials/retried/)")
    g.add_argument("--allow-code-change", action="store_true",
                   help="with --resume: go on although the project's code or a plugin file differs from the code that "
                        "trained the run (else refused, exit 2); recorded in config.json, log.txt and report.md")
    g.add_argument("--jobs", "-j", type=jobs_arg, metavar="N",
                   help="run trials (or, with vectorised seeds, trial groups) in N local worker processes, each "
                        "with max(1, cores // N) threads; 'auto' (default): on the CPU one process per core with 1 "
                        "thread each; on CUDA up to 4 processes sharing the GPU, one per trial group; else 1. Use "
                        "--jobs 1 when the trials' own timings matter")
    g.add_argument("--vectorise-seeds", choices=VECTORISE, metavar="{auto,on,off}",
                   help="train the seeds of each variant as one vectorised trial group (stacked parameters, "
                        "per-seed Adam; each seed still its own trial record, equal to its sequential trial within "
                        "the tolerance of docs/running.md); auto (default): on with CUDA, off on the CPU")
    g.add_argument(OLD_VECTORISE_FLAG, dest="vectorise_seeds", choices=VECTORISE, help=argparse.SUPPRESS)
    g.add_argument("--capture", choices=CAPTURE, metavar="{auto,on,off}",
                   help="step vectorised trial groups through CUDA graphs (static shapes; docs/running.md); auto "
                        "(default): on with CUDA unless HARNESS_CAPTURE=off; on needs a CUDA device (exit 2 on "
                        "the CPU)")
    add_limits(g)
    g.add_argument("--executor", choices=EXECUTORS,
                   help="local (this machine; default) or ray (a Ray cluster: pip install -e '.[ray]')")
    g.add_argument("--address", metavar="ADDR", default=None,
                   help="Ray cluster address, e.g. ray://head:10001 or head:6379 (default: RAY_ADDRESS, "
                        "else a private local cluster)")
    g.add_argument("--threads", type=int, metavar="T", default=None,
                   help="torch threads per trial (default: cores // jobs locally, 1 per Ray task); "
                        "results are bitwise reproducible for the same threads")


def jobs_arg(text: str) -> int | str:
    """``--jobs``: a positive integer or ``auto``."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of processes or 'auto', got {text!r}") from None


def add_limits(g) -> None:
    """``--trial-timeout`` and ``--time-budget`` (:mod:`harness.executors.limits`)."""
    g.add_argument("--trial-timeout", type=seconds_arg, metavar="SECONDS", default=None,
                   help="end a trial (with vectorised seeds: its group) still running SECONDS after its worker "
                        "process started: stored as timed_out with the step it reached, the run goes on (exit 1); "
                        "--resume --retry-failed runs it again. With a limit every trial runs in a worker process "
                        "of its own")
    g.add_argument("--time-budget", type=seconds_arg, metavar="SECONDS", default=None,
                   help="seconds for this whole invocation: trials not started by then stay unstarted (a partial "
                        "run, exit 1; --resume finishes it), running ones end as timed_out")


def seconds_arg(text: str) -> float:
    """``--trial-timeout`` / ``--time-budget``: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def request_from_args(args) -> RunRequest:
    """The :class:`harness.request.RunRequest` of a parsed ``run`` command line."""
    variants = args.variants
    return RunRequest(
        variants=None if variants is None else tuple(variants if isinstance(variants, list) else [variants]),
        grid=bool(getattr(args, "grid", False)), preset=args.preset, overrides=tuple(args.overrides or ()),
        seeds=args.seeds, seed_start=args.seed_start, experiment=args.experiment, check=args.check,
        device=args.device, dtype=args.dtype, executor=args.executor, jobs=args.jobs, threads=args.threads,
        address=args.address, vectorise_seeds=args.vectorise_seeds, capture=args.capture, plugins=plugin_spec(args),
        results_dir=args.results_dir, run_id=args.run_id, quiet=args.quiet, resume=args.resume,
        retry_failed=args.retry_failed, command=command_line(args), tensorboard=args.tensorboard,
        save_models=args.save_models, allow_code_change=args.allow_code_change, mlflow=args.mlflow,
        trial_timeout=args.trial_timeout, time_budget=args.time_budget, baseline=args.baseline,
        keep_checkpoints=args.keep_checkpoints, lr_grid=args.lr_grid)


def main(args) -> int:
    """``python -m harness run``: the request started (or resumed) by :mod:`harness.launch`, its
    outcome printed. Returns the exit code."""
    start_workers_early(args)
    from ..launch import start_run

    request = request_from_args(args)
    if args.suite is not None:
        from .run_suite import main as suite_main

        return suite_main(args, request, on_task=print_outcome)
    return print_outcome(start_run(request))


def start_workers_early(args) -> bool:
    """Start the local workers' fork server before this process imports torch, where the run will
    likely train in worker processes on a GPU: not with ``--jobs 1``, Ray or a CPU ``--device``, and
    only on a machine with a GPU driver (:func:`harness.workers.gpu_likely`). Returns whether it started one."""
    if args.executor not in (None, "local") or args.jobs == 1:
        return False
    if args.device is not None and not str(args.device).startswith(("auto", "cuda")):
        return False
    from ..workers import gpu_likely, start_fork_server

    return gpu_likely() and start_fork_server()


def print_outcome(outcome: RunOutcome) -> int:
    """The command line's ending: a partial run's banner, the summary table and report path on
    stdout, failures and how to resume on stderr. Returns the exit code (0 ok, 1 a trial not ok,
    130 interrupted)."""
    from ..report import partial_banner

    store, meta = outcome.store, outcome.meta
    if outcome.report is not None:
        for line in partial_banner(store, meta, markdown=False):
            print(line)
        print(terminal_summary(outcome))
        print(f"\nreport: {outcome.report}  ({meta.run_wall_s or 0.0:.1f} s)")
    if outcome.interrupted is not None:
        what = "terminated (SIGTERM)" if isinstance(outcome.interrupted, Terminated) else "interrupted"
        print(f"harness: {what}; {outcome.done()} of {outcome.total} trial(s) are stored in {store.root}; "
              f"resume with: python -m harness run --resume {store.root}", file=sys.stderr)
        return 130
    bad = outcome.bad_rows()
    if bad:
        print_failures(bad, outcome.done(), store.root)
    if meta.status == "out_of_time":
        print(f"harness: the time budget was spent before every trial could start; {outcome.done()} of "
              f"{outcome.total} trial(s) are stored in {store.root}; finish with: python -m harness run --resume "
              f"{store.root}", file=sys.stderr)
    return outcome.exit_code


def terminal_summary(outcome: RunOutcome) -> str:
    """The results table for the terminal (``report.md`` and ``summary.csv`` keep every column)."""
    from ..report import summary_table, terminal_table, trials_frame

    store = outcome.store
    if outcome.table is not None:
        return terminal_table(outcome.table)
    table = store.summary if store.summary is not None else summary_table(trials_frame(store))  # aggregated once
    return terminal_table(table)


def print_failures(bad: list[dict], done: int, root) -> None:
    """On stderr: the invalid variants, then each trial not ok with its reason, and
    ``--retry-failed`` only when a retry can change the outcome (a crash or divergence: statuses
    in :data:`harness.launch.RETRY_STATUSES`; an invalid verdict is deterministic and fails again)."""
    from ..launch import RETRY_STATUSES

    invalid = sorted({r["variant"] for r in bad if r.get("status") == "invalid"})
    if invalid:
        print(f"harness: INVALID (excluded from every verdict; see the report's 'Invalid variants'): "
              f"{', '.join(invalid)}", file=sys.stderr)
    retryable = [r for r in bad if r.get("status") in RETRY_STATUSES]
    hint = (f"; after fixing the cause of the failed/diverged/timed-out ones: python -m harness run --resume "
            f"{root} --retry-failed" if retryable else "; an invalid variant fails the same way on every retry: fix it")
    print(f"harness: {len(bad)} of {done} trial(s) did not finish ok (see the report{hint}): "
          + "; ".join(f"{r['variant']} s{r['seed']} {r['status']} ({str(r.get('reason', '')).split('; ')[0][:160]})"
                      for r in bad[:5])
          + (" ..." if len(bad) > 5 else ""), file=sys.stderr)
