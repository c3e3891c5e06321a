"""``python -m harness bench``: training speed of every selected variant next to ``nn.Transformer``.

Heavy imports (torch, pandas) happen inside :func:`main`, so ``python -m harness list`` stays fast.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import DEFAULT_PRESET
from .common import add_output, add_selection, add_task, preset_notes

if TYPE_CHECKING:
    from ..runmeta import RunMeta

DESCRIPTION = """Measure training speed per variant side by side with a torch.nn.Transformer
reference of the same config, in one process, interleaved round-robin: step time (median and
quartiles; forward, backward, optimizer), tokens/s and its ratio to nn.Transformer fp32, FLOPs
per step, achieved FLOP/s and MFU against this machine's matmul throughput (measured by the same
command), and peak memory of a fresh process per contender. Writes bench.csv and bench.md
(command, environment, table) under results/<run-id>/."""

#: bench's default preset (the one command whose default is not :data:`harness.config.DEFAULT_PRESET`:
#: speed is compared at the paper's model size, as docs/benchmarks.md's reference was measured).
BENCH_PRESET = "paper"

EPILOG = """examples:
  python -m harness bench --variants all                      paper config, fp32, 3 warm-up + 8 timed steps
  python -m harness bench --variants all --dtype both         fp32 and bf16 autocast in one run
  python -m harness bench --variants baseline --preset quick --steps 30
  python -m harness bench --variants baseline --preset tiny --task g2p --group-sizes 4,8 --eval --device cpu
  python -m harness bench --variants baseline --dtype both --kernels 12 --steps 3   where the step's time goes"""


def register(sub, parents):
    import argparse

    p = sub.add_parser("bench", parents=parents, help="training speed of variants vs torch.nn.Transformer",
                       description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_selection(p)
    notes = preset_notes()
    p.add_argument("--preset", default=BENCH_PRESET, metavar="NAME",
                   help=f"config preset: {notes}. Default: {BENCH_PRESET}, not {DEFAULT_PRESET} as elsewhere: "
                        f"speed is compared at the Annotated Transformer's size, where the reference numbers "
                        f"of docs/benchmarks.md were measured")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override one config value, e.g. --set train.batch=40")
    add_task(p)
    p.add_argument("--device", default="auto", help="auto (cuda when present), cpu or cuda. Default: auto")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "both"],
                   help="fp32, bf16 (torch.autocast, loss in float32) or both; nn.Transformer always also "
                        "runs in fp32, the yardstick of every ratio. Default: fp32")
    p.add_argument("--steps", type=int, default=8, metavar="N", help="timed steps per contender (default 8)")
    p.add_argument("--warmup-steps", type=int, default=3, metavar="M",
                   help="untimed steps per contender first (default 3)")
    p.add_argument("--old", action="append", default=[], metavar="KEY=VALUE",
                   help="compare settings instead of variants: the first selected variant trained with the "
                        "config plus these overrides (e.g. train.bucket=False) in --old-dtype, interleaved with "
                        "the config as given in --dtype; prints target tokens/s of both and the ratio")
    p.add_argument("--old-dtype", default="fp32", choices=["fp32", "bf16"],
                   help="dtype of the --old arm (default fp32)")
    p.add_argument("--group-sizes", type=group_sizes_arg, default=None, metavar="K[,K...]",
                   help="seeds per second instead of variants: the first selected variant's step run sequentially, "
                        "as vectorised trial groups of each K (run --vectorise-seeds on) and, on CUDA, captured as "
                        "CUDA graphs, side by side with MFU and trials/h, e.g. --group-sizes 1,4,16,64; with --compile also "
                        "the group's whole step compiled (and on CUDA compiled and captured)")
    p.add_argument("--eval", action="store_true",
                   help="with --group-sizes: time the final held-out evaluation (decoding included) of K seeds "
                        "one after another vs in one batched pass (what a trial group runs), per seed; --steps "
                        "and --warmup-steps count evaluation rounds")
    p.add_argument("--kernels", type=int, default=0, metavar="N",
                   help="where a step's time goes instead: each contender's --steps steps under torch.profiler, the "
                        "N largest ops (on CUDA the GPU kernels' device time, on the CPU ops' self time) and the "
                        "share of matmuls, attention, normalisation, copies ... per step")
    p.add_argument("--compile", nargs="?", const="default", default=None, type=compile_modes_arg,
                   metavar="MODE[,MODE...]",
                   help="also run each variant's step through torch.compile (TorchInductor) in each mode: default "
                        "(alone: --compile), reduce-overhead, max-autotune, max-autotune-no-cudagraphs; a contender "
                        "'<variant> compiled [MODE]' beside the eager one, with its MFU (with --group-sizes: one mode without CUDA "
                        "graphs, the arms 'compiled K' and on CUDA 'compiled captured K'). The first steps compile "
                        "(minutes on a CPU, longer with max-autotune): give --warmup-steps enough to cover them. With "
                        "--kernels: the compiled steps' kernels too")
    p.add_argument("--nondeterministic", action="store_true",
                   help="time the steps without the trials' deterministic algorithms (torch's and Inductor's: "
                        "under them max-autotune times no candidates): what determinism costs. Runs never "
                        "use this; bench.md and config.json say it was on")
    p.add_argument("--no-memory", dest="memory", action="store_false",
                   help="skip the fresh-process peak-memory measurements (about 5 s per contender and dtype)")
    add_output(p, "bench")
    p.set_defaults(func=main)


def group_sizes_arg(text: str) -> list[int]:
    """``--group-sizes``: comma-separated positive integers."""
    import argparse

    try:
        sizes = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected group sizes like 1,4,16, got {text!r}") from None
    if not sizes or any(k < 1 or k > 1024 for k in sizes):
        raise argparse.ArgumentTypeError(f"group sizes must be between 1 and 1024, got {text!r}")
    return sizes


def compile_modes_arg(text: str) -> list[str]:
    """``--compile``: comma-separated ``torch.compile`` modes (:data:`harness.perf.bench.COMPILE_MODES`)."""
    import argparse

    from ..perf.bench import COMPILE_MODES

    modes = [m for m in text.replace(" ", "").split(",") if m]
    bad = [m for m in modes if m not in COMPILE_MODES]
    if not modes or bad:
        raise argparse.ArgumentTypeError(f"unknown compile mode {(bad or [text])[0]!r}: use "
                                         f"{', '.join(COMPILE_MODES)}, comma-separated")
    return list(dict.fromkeys(modes))


def render_markdown(rows: list[dict], info: dict, meta: RunMeta) -> str:
    """``bench.md``: command, environment, config, machine peaks, table, summary, notes."""
    import json

    from ..perf.bench import MEMORY_STEPS, REFERENCE, summary_lines, table_frame

    env = meta.environment
    lines = [f"# Speed benchmark ({meta.preset or 'custom'} config)", "", "```", meta.command, "```", "",
             "## Environment", ""]
    lines += [f"- {k}: {v}" for k, v in env.items() if v is not None]
    lines += ["", "## Config", "", "```json"] + [f'"{k}": {json.dumps(v)}' for k, v in meta.config.items()]
    lines += ["```", "",
              f"Timed steps per contender: {meta.steps} after {meta.warmup_steps} warm-up steps, interleaved "
              f"round-robin (order rotated each round); label tokens per step: {info['tokens_per_step']}; "
              f"bench wall time {info['bench_s']:.0f} s.", "",
              "## Machine matmul throughput (same command)", ""]
    lines += [f"- {d}: {g:,.0f} GFLOP/s (median of {meta.steps} ({info['peak_n']} x {info['peak_n']}) "
              f"@ ({info['peak_n']} x {info['peak_n']}) matmuls, one per round)"
              for d, g in info["peak_gflop_per_s"].items()]
    lines += ["", "## Results", "", table_frame(rows).to_markdown(index=False, tablefmt="github"), "",
              "## Summary", ""]
    lines += [f"- {s}" for s in summary_lines(rows)]
    lines += ["", "## How to read this", "",
              f"- `x {REFERENCE} fp32`: tokens/s divided by {REFERENCE}'s float32 tokens/s in this run.",
              "- tokens/s: label tokens per step / median step time; step = forward + float32 loss, backward, "
              "gradient norm, Adam (fused) and schedule, exactly the step of `harness run`.",
              "- GFLOP/step: counted by `torch.utils.flop_counter.FlopCounterMode` over forward + backward "
              "(matmuls and attention only). MFU = GFLOP/step / median step time / the matmul throughput above "
              "in the same dtype.",
              "- peak RSS: a fresh process that builds the contender and trains it for "
              f"{MEMORY_STEPS} steps (interpreter and torch included).",
              f"- {REFERENCE}: `torch.nn.Transformer` (batch_first, post-norm, bool masks) with the harness's "
              "embeddings, PE and generator, same sizes; `seed_000` is the Annotated Transformer's architecture "
              "assembled by the harness."]
    if meta.compile_modes:
        lines.append("- `<variant> compiled [MODE]`: the variant's model through `torch.compile` (TorchInductor) in "
                     "that mode (none named: `default`), same initial weights; the loss, backward call and optimizer "
                     "stay eager. Compilation happens in the first (warm-up) rounds.")
    lines.append("- Timed **without** deterministic algorithms (`--nondeterministic`): torch's and Inductor's "
                 "(which otherwise times no autotuning candidates); a trial always runs with them, and so do "
                 "the peak-RSS measurements (fresh processes)."
                 if meta.nondeterministic else
                 "- Timed with the trials' deterministic algorithms (torch's and Inductor's: max-autotune then "
                 "times no candidates; `--nondeterministic` measures without them).")
    return "\n".join(lines) + "\n"


def write_outputs(store_root: Path, rows: list[dict], info: dict, meta: RunMeta) -> tuple[Path, Path]:
    """Write ``bench.csv`` and ``bench.md`` atomically under ``store_root``."""
    import pandas as pd

    from ..store import atomic_write_text

    csv_path, md_path = Path(store_root) / "bench.csv", Path(store_root) / "bench.md"
    atomic_write_text(csv_path, pd.DataFrame(rows).to_csv(index=False))
    atomic_write_text(md_path, render_markdown(rows, info, meta))
    return csv_path, md_path


def check_options(args) -> None:
    """Raises BenchError for options that do not go together (each message says what to drop or add); warns
    (HarnessWarning) when ``--compile`` leaves compilation in the measured steps."""
    from ..perf.bench import BenchError

    if args.steps < 1 or args.warmup_steps < 0:
        raise BenchError(f"--steps must be >= 1 and --warmup-steps >= 0, got {args.steps} and {args.warmup_steps}")
    if args.kernels < 0 or (args.kernels and (args.group_sizes or args.old)):
        raise BenchError("--kernels N profiles the contenders' plain steps: N >= 1, without --group-sizes or --old")
    if (args.compile or args.nondeterministic) and (args.old or args.eval):
        raise BenchError("--compile and --nondeterministic go with the plain bench, --kernels or --group-sizes: "
                         "drop --old and --eval")
    if args.compile and args.group_sizes:
        from ..perf.bench import CUDAGRAPH_MODES

        if len(args.compile) > 1 or args.compile[0] in CUDAGRAPH_MODES:
            raise BenchError(f"with --group-sizes, --compile takes one mode without CUDA graphs (default or "
                             f"max-autotune-no-cudagraphs), got {','.join(args.compile)}: the 'compiled captured' "
                             "arms make their own CUDA graph of the compiled step")
    if args.compile and args.warmup_steps < (1 if args.group_sizes else 3):
        import warnings

        from ..errors import HarnessWarning

        warnings.warn(HarnessWarning(
            f"--compile with --warmup-steps {args.warmup_steps}: each compiled contender compiles in its first step "
            "and CUDA-graph modes record in the next ones, so those land in the timed or profiled steps; give "
            + ("1 or more (a captured arm warms up before it captures)" if args.group_sizes else "3 or more")))
    if args.eval and not args.group_sizes:
        raise BenchError("--eval times the evaluation of trial groups: give their sizes with --group-sizes, e.g. 4,8")


def main(args) -> int:
    from ..perf.bench import TERMINAL_DROPS, bench_meta, run_bench, summary_lines, table_frame
    from ..report.terminal import narrowed_table
    from .common import plugin_spec
    from ..env import resolve_device, trial_settings
    from ..store import RunStore
    from .common import check_task, command_line, load_registry, resolve_config, select_variants

    check_options(args)
    reg = load_registry(args)
    variants = select_variants(reg, args)
    cfg = resolve_config(args, reg)
    check_task(reg, cfg)
    device = resolve_device(args.device)
    dtypes = ["fp32", "bf16"] if args.dtype == "both" else [args.dtype]
    plugins = plugin_spec(args).to_dict()
    trial_settings()  # before the environment block records the settings
    if args.nondeterministic:  # the environment block records it; run_bench keeps it so
        import torch

        torch.use_deterministic_algorithms(False)
    command = command_line()
    meta = bench_meta(command, args.preset, cfg, device, dtypes, args.steps, args.warmup_steps, variants, plugins)
    meta.nondeterministic = True if args.nondeterministic else None
    meta.compile_modes = args.compile
    store = RunStore.create(args.results_dir, meta, args.run_id, prefix="bench-")  # taken: -2, -3 ...
    log = None if args.quiet else (lambda line: print(f"bench: {line}", file=sys.stderr, flush=True))
    if log:
        log(f"{store.root}: {len(variants)} variant(s) + nn.Transformer, {'/'.join(dtypes)}, "
            f"{args.warmup_steps} warm-up + {args.steps} timed steps each, on {device.type}")
    if args.old:
        return _settings_main(args, variants[0], cfg, reg, device, store, meta, log)
    if args.eval:
        return _eval_main(args, variants[0], cfg, reg, device, dtypes, store, meta, log)
    if args.kernels > 0:
        return _kernels_main(args, variants, cfg, reg, device, dtypes, store, meta, log)
    if args.group_sizes:
        return _seeds_main(args, variants[0], cfg, reg, device, dtypes, store, meta, log)
    rows, info = run_bench(variants, cfg, device, dtypes, args.steps, args.warmup_steps, reg, plugins,
                           memory=args.memory, log=log, compile=args.compile or (),
                           deterministic=not args.nondeterministic)
    meta.peak_gflop_per_s, meta.bench_s = info["peak_gflop_per_s"], info["bench_s"]
    store.write_meta(meta)
    csv_path, md_path = write_outputs(store.root, rows, info, meta)
    print(narrowed_table(table_frame(rows), TERMINAL_DROPS, "bench.md"))
    print()
    for d, g in info["peak_gflop_per_s"].items():
        print(f"matmul throughput {d}: {g:,.0f} GFLOP/s")
    for line in summary_lines(rows):
        print(line)
    print(f"\nbench: {md_path}  {csv_path}  ({info['bench_s']:.0f} s)")
    return 0


def _settings_main(args, variant, cfg, reg, device, store, meta, log) -> int:
    """``bench --old KEY=VALUE ...``: one variant under old and new settings, interleaved
    (:mod:`harness.perf.settings`); writes bench.csv and bench.md, prints the table and the ratio."""
    import pandas as pd

    from ..perf.bench import BenchError
    from ..perf.settings import run_settings_bench, settings_table
    from ..settings import parse_overrides
    from ..store import atomic_write_text

    if args.dtype == "both":
        raise BenchError("--old compares two arms: give the new arm's dtype as --dtype fp32 or --dtype bf16")
    old_cfg = reg.task(cfg.train.task).for_config(cfg).fit(cfg.override(parse_overrides(args.old)), set())
    reg.task(old_cfg.train.task).for_config(old_cfg).validate(old_cfg)
    changes = ", ".join(args.old)
    rows = run_settings_bench(variant, old_cfg, cfg, args.old_dtype, args.dtype, changes, reg, device,
                              args.steps, args.warmup_steps, log)
    table = settings_table(rows).to_markdown(index=False, tablefmt="github")
    ratio = f"new / old target tokens/s: {rows[1]['vs_old']:.2f}x (variant {variant.name}, task {cfg.train.task})"
    meta.old, meta.old_dtype = args.old, args.old_dtype
    store.write_meta(meta)
    env = meta.environment
    md = "\n".join([f"# Speed: old vs new settings ({meta.preset or 'custom'} config)", "", "```", meta.command,
                    "```", "", "## Environment", ""] + [f"- {k}: {v}" for k, v in env.items() if v is not None]
                   + ["", f"Arms interleaved, order alternating each round; {args.warmup_steps} warm-up + "
                      f"{args.steps} timed steps per arm; target tokens/s = label tokens of the timed steps / "
                      "their summed step time (harness.perf.settings).", "", table, "", ratio]) + "\n"
    atomic_write_text(store.root / "bench.csv", pd.DataFrame(rows).to_csv(index=False))
    atomic_write_text(store.root / "bench.md", md)
    print(table)
    print(ratio)
    print(f"\nbench: {store.root / 'bench.md'}")
    return 0


def _write_arm_bench(store, meta, title: str, note: str, rows: list[dict], markdown: str, terminal: str,
                     seconds: float) -> int:
    """The outputs of ``bench --group-sizes`` (with or without ``--eval``) and ``--kernels``: bench.md
    (``title``, the command, the environment, ``note``, the table(s) ``markdown``), bench.csv
    (``rows``); prints ``terminal``, the same table(s) laid out for a 120-column terminal."""
    import pandas as pd

    from ..store import atomic_write_text

    md = "\n".join([f"# {title}", "", "```", meta.command, "```", "", "## Environment", ""]
                   + [f"- {k}: {v}" for k, v in meta.environment.items() if v is not None]
                   + ["", note, "", markdown]) + "\n"
    atomic_write_text(store.root / "bench.csv", pd.DataFrame(rows).to_csv(index=False))
    atomic_write_text(store.root / "bench.md", md)
    print(terminal)
    print(f"\nbench: {store.root / 'bench.md'}  ({seconds:.0f} s)")
    return 0


def _table_bench(store, meta, title: str, note: str, rows: list[dict], frame, seconds: float,
                 drops: tuple[str, ...] = ()) -> int:
    """:func:`_write_arm_bench` for one table ``frame``: whole in bench.md; on the terminal its columns in
    ``drops`` left to bench.md while it is wider than 120 characters."""
    from ..report.terminal import narrowed_table

    return _write_arm_bench(store, meta, title, note, rows, frame.to_markdown(index=False, tablefmt="github"),
                            narrowed_table(frame, drops, "bench.md"), seconds)


def _seeds_main(args, variant, cfg, reg, device, dtypes, store, meta, log) -> int:
    """``bench --group-sizes K,...``: sequential vs vectorised vs captured seeds of one variant
    (:mod:`harness.perf.seeds`); writes bench.csv and bench.md, prints the table."""
    from ..perf.seeds import run_seed_bench, seed_table

    rows, peaks, seconds = [], {}, 0.0
    for dtype in dtypes:
        got, info = run_seed_bench(variant, cfg, device, dtype, args.group_sizes, args.steps, args.warmup_steps,
                                   reg, log, compile_mode=(args.compile or [None])[0])
        rows += got
        peaks.update(info["peak_gflop_per_s"])
        seconds += info["bench_s"]
    meta.group_sizes, meta.peak_gflop_per_s, meta.bench_s = args.group_sizes, peaks, seconds
    store.write_meta(meta)
    note = (f"Arms interleaved round-robin (order rotated each round); {args.warmup_steps} warm-up + "
            f"{args.steps} timed steps per arm; batch {cfg.train.batch}, label tokens per seed-step "
            f"{info['tokens_per_step']}; trials/h counts the {cfg.train.steps} training steps of a trial "
            "only (no evaluation, no decoding); MFU against the matmul throughput measured by this "
            "command: " + ", ".join(f"{d} {g:,.0f} GFLOP/s" for d, g in peaks.items()) + "; ops / step: the "
            "aten ops that do work in one more step of the arm (all K seeds; a captured arm's are the kernels its "
            "graph replays), about one GPU kernel each (harness.perf.seeds)"
            + (f"; compiled arms: the group's whole step through torch.compile, mode {args.compile[0]} (their ops "
               "are not counted)" if args.compile else "") + ".")
    title = f"Seeds per second: {variant.name} ({meta.preset or 'custom'} config, task {cfg.train.task})"
    return _table_bench(store, meta, title, note, rows, seed_table(rows), seconds,
                        drops=("GFLOP/s", "step ms", "seed-steps/s"))


def _eval_main(args, variant, cfg, reg, device, dtypes, store, meta, log) -> int:
    """``bench --group-sizes K,... --eval``: the evaluation of K seeds one after another vs batched
    (:mod:`harness.perf.eval`); writes bench.csv and bench.md, prints the table."""
    from ..perf.eval import eval_table, run_eval_bench

    rows, seconds = [], 0.0
    for dtype in dtypes:
        got, info = run_eval_bench(variant, cfg, device, dtype, args.group_sizes, args.steps, args.warmup_steps,
                                   reg, log)
        rows += got
        seconds += info["bench_s"]
    meta.group_sizes, meta.bench_s = args.group_sizes, seconds
    store.write_meta(meta)
    note = (f"Arms interleaved round-robin (order rotated each round); {args.warmup_steps} warm-up + "
            f"{args.steps} timed rounds per arm; each round one final evaluation ({info['eval_rows']} held-out "
            "sequences) of the arm's seeds, freshly initialised models, one intra-op thread on the CPU "
            "(harness.perf.eval).")
    title = f"Evaluation per seed: {variant.name} ({meta.preset or 'custom'} config, task {cfg.train.task})"
    return _table_bench(store, meta, title, note, rows, eval_table(rows), seconds)


def _kernels_main(args, variants, cfg, reg, device, dtypes, store, meta, log) -> int:
    """``bench --kernels N``: each contender's step under torch.profiler (:mod:`harness.perf.kernels`);
    writes bench.csv (the N largest ops of every arm) and bench.md (per arm: categories and ops)."""
    from ..perf.kernels import kernel_markdown, run_kernel_bench

    rows, info = run_kernel_bench(variants, cfg, device, dtypes, args.steps, args.warmup_steps, reg, args.kernels, log,
                                  compile=args.compile or ())
    meta.bench_s = info["bench_s"]
    store.write_meta(meta)
    note = (f"{args.warmup_steps} warm-up + {args.steps} profiled steps per arm, one arm after another; "
            f"{info['unit']} summed by name per step, the {args.kernels} largest per arm; categories by name "
            "(harness.perf.kernels.CATEGORIES, a reading aid). Profiled steps run slower than plain ones: "
            "use the shares, and plain bench for step times.")
    title = f"Where the step's time goes ({meta.preset or 'custom'} config, task {cfg.train.task}, {device.type})"
    from ..report.terminal import wrapped_table

    return _write_arm_bench(store, meta, title, note, rows, kernel_markdown(rows, info),
                            kernel_markdown(rows, info, wrapped_table), info["bench_s"])
