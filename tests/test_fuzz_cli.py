"""Fuzzed command lines: every input gives exit 0 (a complete results folder), or one line on
stderr and exit 2 with nothing written -- never a traceback, never a partial results folder.

Hypothesis builds command lines for ``run`` from the options its own parser declares (so every
option documented in ``--help`` is drawn, with valid and invalid values), ``--set`` overrides
with generated keys and values, experiment files (generated TOML documents and raw bytes), and
command lines for ``report``, ``verify``, ``compare``, ``list`` and ``experiments`` on a
pool of existing, foreign, damaged and missing paths. Each runs in this process through
:func:`harness.cli.main` (stderr captured).

To keep every case at milliseconds the numerical work is faked -- not the CLI: a trial returns
a copy of one real tiny trial's row with its identity filled in, the Ray session is a no-op,
a grad-norm measurement builds a tiny model and returns fixed norms, and the report's plots are
skipped (matplotlib). Everything else -- parsing, validation, planning, storing, the report's
tables and statistics, resume -- is the real code.

The test prints the number of generated cases and its wall time; CI gets a fixed seed
(``derandomize``), so a failure is reproducible.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import math
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis", reason="pip install -e '.[test]' (hypothesis) for the fuzz test")
from hypothesis import HealthCheck, Phase, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from harness import cli  # noqa: E402
from harness.verification import verify_run  # noqa: E402
from harness.config import RunConfig  # noqa: E402
from harness.runmeta import OLD_VECTORISE_FLAG  # noqa: E402
from harness.store import RunStore  # noqa: E402
from harness.trial import TrialResult  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_PLUGIN = ROOT / "examples" / "harness-example" / "harness_example.py"
#: 250 examples in CI (500 took ~25 s on the shared 2-core machine; the suite is kept under 5 min); hunt with
#: HARNESS_FUZZ_EXAMPLES=2000. HARNESS_FUZZ_RANDOM=1 hunts with fresh random inputs instead of CI's fixed ones.
MAX_EXAMPLES = int(os.environ.get("HARNESS_FUZZ_EXAMPLES", "250"))
MIN_EXAMPLES = min(MAX_EXAMPLES, 600)  # fewer means Hypothesis rejected too much: the strategies are wrong

MODEL_KEYS = ["N", "d_model", "h", "d_ff", "dropout", "vocab", "pad", "max_len"]
TRAIN_KEYS = ["task", "seq_len", "batch", "steps", "optimizer", "weight_decay", "decay_all", "lr", "noam_factor", "warmup",
              "schedule", "min_lr", "decay_fraction", "label_smoothing", "eval_every", "eval_sequences", "eval_seed",
              "grad_clip", "stop_at_solved"]


# ------------------------------------------------------------------------------------ fakes

@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """One real trial (tiny preset), the template of every faked one."""
    root = tmp_path_factory.mktemp("fuzz_template")
    assert cli.main(["run", "--variants", "baseline", "--preset", "tiny", "--device", "cpu", "--jobs", "1",
                     "--threads", "1", "--results-dir", str(root), "--run-id", "t", "-q"]) == 0
    return json.loads((root / "t" / "trials" / "baseline__s0.json").read_text())


def _fake_result(template: dict, spec: dict) -> dict:
    if spec.get("measure"):  # a measurement at initialisation (grad_norm_at_init)
        n = spec["config"]["model"]["N"]
        row = {"variant": spec["variant"], "seed": spec["seed"], "point": spec.get("point", ""), "N": n,
               **{f"slot_{k}": v for k, v in sorted((spec.get("slots") or {}).items())}, "status": "ok", "reason": ""}
        for stack, base in (("enc", 1.0), ("dec", 2.0)):
            row.update({f"{stack}_first": base, f"{stack}_last": base + n - 1, f"{stack}_last_over_first": (base + n - 1) / base})
        row.update({"loss_at_init": 2.3, "wall_s": 0.01})
        curve = [{"stack": s, "layer": i, "grad_norm": b + i} for s, b in (("encoder", 1.0), ("decoder", 2.0))
                 for i in range(n)]
        return {"row": row, "curve": curve}
    result = copy.deepcopy(template)
    result.pop("checksum", None)
    row = {k: v for k, v in result["row"].items() if not k.startswith("slot_")}
    row.update({"variant": spec["variant"], "seed": spec["seed"], "point": spec.get("point", ""),
                "threads": spec.get("threads") or 1, "dtype": spec.get("dtype", "fp32"),
                "steps": spec["config"]["train"]["steps"], "device": "cpu",
                **{f"slot_{k}": v for k, v in sorted((spec.get("slots") or {}).items())}})
    row["heldout_ce"] = 2.0 + (hash((spec["variant"], spec["seed"])) % 100) / 1000  # some spread
    result["row"] = row
    return result


@pytest.fixture
def faked(template):
    """Patch the numerical work (see the module docstring) for one test. It relies on every harness
    module being imported before any test (tests/conftest.py, ``import_every_harness_module``): one
    imported for the first time under the patch would keep the fakes it binds with ``from .model
    import build_model`` after the undo, for every later test in this process."""
    from harness import model
    from harness.executors import pool, ray_cluster, sequential
    from harness.experiments import figures

    real_build = model.build_model
    tiny = RunConfig.from_dict({"model": {"N": 1, "d_model": 8, "h": 2, "d_ff": 8, "max_len": 16},
                                "train": {"seq_len": 4}}).model

    def fake_sequential(specs, on_done, *args, **kwargs):
        for ts in specs:
            on_done(ts, TrialResult.from_dict(_fake_result(template, ts.to_dict())))

    def fake_pool(specs, jobs, on_done, *args, **kwargs):
        fake_sequential(specs, on_done)

    @contextlib.contextmanager
    def fake_ray_session(*args, **kwargs):
        yield None

    def fake_build(registry, variant, cfg, seed=0):
        return real_build(registry, variant, tiny, seed=seed)


    mp = pytest.MonkeyPatch()
    mp.setattr(sequential, "run_sequential", fake_sequential)
    mp.setattr(ray_cluster, "run_ray", fake_sequential)
    mp.setattr(pool, "run_process_pool", fake_pool)
    mp.setattr(ray_cluster, "ray_session", fake_ray_session)
    mp.setattr(model, "build_model", fake_build)
    from harness.report import plots

    for mod, names in ((plots, ("plot_curves", "plot_final_metrics", "plot_steps_to_solve")),
                       (figures, ("plot_grad_norm_depth", "plot_grad_norm_layers", "plot_failures"))):
        for name in names:  # matplotlib is most of a report's time; plots have tests of their own
            mp.setattr(mod, name, lambda *a, **k: None)
    from harness import overview  # check's classes have tests of their own (test_suite.py, test_checks.py)

    mp.setattr(overview, "check_classes", lambda *a, **k: {"classes": [], "failures": [], "wall_s": 0.0})
    yield
    mp.undo()


# ------------------------------------------------------------------------------- strategies

JUNK = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
SURROGATE = st.just("caf\udce9")  # what Python makes of a non-UTF-8 byte on the command line
NUMBERS = st.one_of(st.integers(-3, 40), st.sampled_from([0, 1, 2, 10**6, 10**12, -(10**9)]))
FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=False), st.sampled_from([0.0, 0.1, 0.5, 1.0]))
SCALAR = st.one_of(NUMBERS, FLOATS, st.booleans(), JUNK,
                   st.sampled_from(["copy", "copy_fixed", "reverse", "sort", "copy_length", "noam", "constant"]))


def _literal(v) -> str:
    """``--set`` value text: a Python literal (as ast.literal_eval reads it) or raw text."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # nan / inf: read as text, must be rejected as a string
    return repr(v) if not isinstance(v, str) else v


SET_KEYS = st.one_of(st.sampled_from([f"model.{k}" for k in MODEL_KEYS] + [f"train.{k}" for k in TRAIN_KEYS]),
                     st.sampled_from(["model.", "train", "seeds", "x.y", ".N", "model.N.x", "", "train.steps "]),
                     JUNK)
SET_ITEMS = st.one_of(
    st.builds(lambda k, v: f"{k}={_literal(v)}", SET_KEYS, SCALAR),
    st.builds(lambda k, v: f"{k}={v}", SET_KEYS, JUNK),
    JUNK)

VARIANTS = st.one_of(st.sampled_from(["all", "baseline", "pre_norm", "baseline,pre_norm", "seed_*", "bug*",
                                      "bug_001_uint8_invert", "basline", "nothing*", "", ",", "example_rmsnorm"]),
                     JUNK, SURROGATE)
RUN_IDS = st.one_of(st.sampled_from(["r1", "existing", "a.b", "run-2", "..", ".", "../x", "/tmp/x", "", "-x",
                                     "a/b", "x" * 101, "ok_name", "a..b", " sp"]), JUNK, SURROGATE)
PRESETS = st.one_of(st.sampled_from(["tiny", "quick", "paper", "quik", ""]), JUNK)
DEVICES = st.one_of(st.sampled_from(["cpu", "auto", "cuda", "cuda:0", "tpu", ""]), JUNK)


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v) if not (isinstance(v, float) and not math.isfinite(v)) else ("nan" if v != v else
                                                                                   ("inf" if v > 0 else "-inf"))
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


TOML_SCALAR = st.one_of(st.integers(-2, 40), st.sampled_from([0.5, 1.0, float("inf")]), st.booleans(),
                        st.sampled_from(["baseline", "pre_norm", "copy", "noam", "x", ""]))
CONFIG_TABLE = st.dictionaries(st.sampled_from(["model", "train", "N", "lr", "steps", "model.N", "junk"]),
                               st.one_of(TOML_SCALAR, st.dictionaries(st.sampled_from(MODEL_KEYS + TRAIN_KEYS),
                                                                      TOML_SCALAR, max_size=3)), max_size=3)
CLAIM = st.dictionaries(st.sampled_from(["text", "check", "variant", "expected", "a", "b", "within", "N",
                                         "min_fraction"]),
                        st.one_of(TOML_SCALAR, st.sampled_from(["verdict", "slope", "params_difference",
                                                                "equivalent", "2*vocab*d_model", "1+"]),
                                  st.lists(TOML_SCALAR, max_size=2)), max_size=5)
EXPERIMENT = st.fixed_dictionaries(
    {"description": st.one_of(st.just("fuzzed experiment"), TOML_SCALAR)},
    optional={
        "name": st.one_of(st.sampled_from(["fz", "../fz", "a b", "", "fz.1"]), JUNK),
        "kind": st.sampled_from(["train", "grad_norm_at_init", "other"]),
        "preset": st.sampled_from(["tiny", "quick", "nope"]),
        "variants": st.one_of(st.lists(st.sampled_from(["baseline", "pre_norm", "basline", "bug*", ""]),
                                       max_size=3), TOML_SCALAR),
        "seeds": st.one_of(st.integers(-1, 3), st.lists(st.integers(-1, 4), max_size=3), TOML_SCALAR),
        "baseline": st.sampled_from(["baseline", "pre_norm", "nope"]),
        "metric": st.sampled_from(["heldout_ce", "exact_match", "nope"]),
        "task": st.sampled_from(["copy", "copy_fixed", "nope"]),
        "config": CONFIG_TABLE,
        "sweep": st.dictionaries(st.sampled_from(["lr", "N", "model.d_model", "train.steps", "junk"]),
                                 st.one_of(st.lists(TOML_SCALAR, max_size=3), TOML_SCALAR), max_size=2),
        "analysis": st.dictionaries(st.sampled_from(["fail_if_below", "fail_if_above", "junk"]),
                                    st.one_of(st.dictionaries(st.sampled_from(["exact_match", "heldout_ce", "x"]),
                                                              TOML_SCALAR, max_size=2), TOML_SCALAR), max_size=2),
        "measure": st.dictionaries(st.sampled_from(["batches", "parameter", "junk"]),
                                   st.one_of(st.integers(-1, 3), st.sampled_from(["feed_forward.w_2.weight",
                                                                                  "nope.weight"])), max_size=2),
        "claim": st.lists(CLAIM, max_size=2),
        "junk_key": TOML_SCALAR,
    })


def _toml_text(doc: dict) -> str:
    return "\n".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in doc.items()) + "\n"


EXPERIMENT_FILE = st.one_of(
    EXPERIMENT.map(lambda d: _toml_text(d).encode()),
    st.binary(max_size=40),
    st.just(b'description = "x"\nvariants = ["baseline"]\nseeds = 1\n\xff\xfe\x00'),
    st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass")))


#: every option ``run --help`` documents and the one it hides (the old spelling of ``--vectorise-seeds``),
#: drawn by :func:`run_argv` (checked against the parser by :func:`test_the_fuzz_draws_every_documented_run_option`)
RUN_OPTIONS = ["--variants", "--grid", "--preset", "--set", "--task", "--device", "--dtype", "--experiment", "--seeds",
               "--seed-start", "--results-dir", "--run-id", "--resume", "--jobs", "--executor", "--address",
               "--threads", "-p", "--plugin", "--strict-plugins", "--quiet", "--help", "--no-check", "--suite",
               "--retry-failed", "--allow-code-change", "--tensorboard", "--mlflow", "--save-models",
               "--vectorise-seeds", "--capture", "--baseline", "--keep-checkpoints", "--trial-timeout", "--time-budget", "--lr-grid",
               OLD_VECTORISE_FLAG]  # the hidden alias of --vectorise-seeds


@st.composite
def run_argv(draw):
    """``run`` with options drawn from the ones its parser declares, each with good and bad values."""
    argv: list[str] = ["run"]
    files: dict[str, bytes] = {}
    options = draw(st.lists(st.sampled_from(RUN_OPTIONS + ["--junk-option", "positional"]), max_size=7))
    if "--help" in options and draw(st.integers(0, 9)):  # --help only now and then
        options.remove("--help")
    if "--run-id" not in options and "--resume" not in options:
        argv += ["--run-id", "fz"]  # a valid run id by default, so a folder is looked for where expected
    preset_given = False
    for opt in options:
        if opt in ("--grid", "--strict-plugins", "--quiet", "--help", "--junk-option", "--no-check", "--retry-failed",
                   "--allow-code-change", "--save-models", "--keep-checkpoints"):
            argv.append(opt)
        elif opt == "--tensorboard":  # its folder is optional: a flag after it keeps a later positional out
            argv += ["--tensorboard", draw(st.sampled_from(["-q", "results/tb"]))]
        elif opt == "--mlflow":  # its URI is optional too; without the mlflow package: exit 2, one line
            argv += ["--mlflow", draw(st.sampled_from(["-q", "file:results/mlruns"]))]
        elif opt in ("--vectorise-seeds", OLD_VECTORISE_FLAG):  # on the CPU 'on' trains the seeds as one group
            argv += [opt, draw(st.one_of(st.sampled_from(["auto", "on", "off", "yes"]), JUNK))]
        elif opt == "--capture":  # on the CPU 'on' is refused (CUDA graphs) with exit 2, as are bad values
            argv += ["--capture", draw(st.one_of(st.sampled_from(["auto", "on", "off", "yes"]), JUNK))]
        elif opt == "--baseline":  # a variant of the run, one it does not hold, or junk: exit 0 or one line, exit 2
            argv += ["--baseline", draw(st.one_of(VARIANTS, JUNK))]
        elif opt in ("--trial-timeout", "--time-budget"):
            # bad values only (one line, exit 2): a valid limit trains real trials in worker processes, which the
            # fake cannot reach; whole limited runs are tests/test_limits.py's
            argv += [opt, draw(st.one_of(st.sampled_from(["0", "-1", "nan", "inf", "x", ""]), JUNK))]
        elif opt == "--suite":
            # bad suite names and files; a good one only with an option the suite file owns (exit 2):
            # whole suites run in tests/test_suite.py, not hundreds of times here
            name = draw(st.one_of(st.sampled_from(["default", "", "nope", "../default", "experiments/bad.toml"]),
                                  JUNK, SURROGATE))
            files["bad.toml"] = draw(st.sampled_from([b"seeds = 0", b"\xff\xfe", b"tasks = [", b""]))
            argv += ["--suite", name, "--seeds", "2"] if name in ("default", "") else ["--suite", name]
        elif opt == "--lr-grid":  # good grids (refused with the default noam schedule: exit 2), bad values, junk
            argv += ["--lr-grid", draw(st.one_of(st.sampled_from(["1e-3,3e-3", "1e-3", "0", "-1e-3", "1e-3,1e-3", "x",
                                                                  "", "nan,1e-3"]), JUNK))]
        elif opt == "positional":
            argv.append(draw(JUNK))
        elif opt == "--variants":
            argv += ["--variants", *draw(st.lists(VARIANTS, min_size=1, max_size=2))]
        elif opt == "--preset":
            preset_given = True
            argv += ["--preset", draw(PRESETS)]
        elif opt == "--set":
            argv += ["--set", draw(SET_ITEMS)]
        elif opt == "--device":
            argv += ["--device", draw(DEVICES)]
        elif opt == "--task":
            argv += ["--task", draw(st.one_of(st.sampled_from(["copy", "copy_fixed", "reverse", "sort", "copy_length",
                                                               "copyy", ""]), JUNK))]
        elif opt == "--dtype":
            argv += ["--dtype", draw(st.sampled_from(["fp32", "bf16", "fp16", ""]))]
        elif opt == "--experiment":
            kind = draw(st.sampled_from(["file", "file", "file", "name", "missing"]))
            if kind == "file":
                files["exp.toml"] = draw(EXPERIMENT_FILE)
                argv += ["--experiment", "experiments/exp.toml"]
            elif kind == "name":
                argv += ["--experiment", draw(st.one_of(st.sampled_from(["exp", "nonexistent", "../exp", ""]),
                                                        JUNK, SURROGATE))]
                files.setdefault("exp.toml", draw(EXPERIMENT_FILE))
            else:
                argv += ["--experiment", "experiments/missing.toml"]
        elif opt in ("--seeds", "--seed-start", "--threads"):
            small = st.one_of(st.integers(-2, 4), st.sampled_from([10**5, 10**12, -(10**9)]))
            argv += [opt, str(draw(small)) if draw(st.integers(0, 5)) else draw(JUNK)]
        elif opt == "--jobs":
            argv += ["--jobs", draw(st.one_of(st.sampled_from(["auto", "1", "2", "0", "-1", "x"]),
                                              NUMBERS.map(str)))]
        elif opt == "--executor":
            argv += ["--executor", draw(st.sampled_from(["local", "ray", "dask"]))]
        elif opt == "--address":
            argv += ["--address", draw(st.sampled_from(["127.0.0.1:6379", "ray://h:10001", "auto", ""]))]
        elif opt == "--results-dir":
            argv += ["--results-dir", draw(st.sampled_from(["results", "results/sub", "a_file", "", "results/../results"]))]
        elif opt == "--run-id":
            argv += ["--run-id", draw(RUN_IDS)]
        elif opt == "--resume":
            argv += ["--resume", draw(st.sampled_from(["results/existing", "results/foreign", "results/nope",
                                                       "a_file", "results", ""]))]
        elif opt == "-p":
            argv += ["-p", draw(st.sampled_from(["harness_example", "no_such_module", "os.path", ""]))]
        elif opt == "--plugin":
            argv += ["--plugin", draw(st.sampled_from([str(EXAMPLE_PLUGIN), "no_such_plugin.py", "a_file", ""]))]
    if not preset_given and "--resume" not in options and draw(st.integers(0, 3)):
        argv += ["--preset", "tiny"]  # mostly small plans (the fake makes size irrelevant, not count)
    if "--results-dir" not in options:
        argv += ["--results-dir", "results"]
    return argv, files


OTHER_PATHS = st.sampled_from(["results/existing", "results/foreign", "results/damaged", "results/nope", "existing",
                               "latest", "a_file", "", "results"])


@st.composite
def other_argv(draw):
    command = draw(st.sampled_from(["report", "verify", "compare", "list", "experiments"]))
    argv = [command]
    if command in ("report", "verify"):
        argv.append(draw(OTHER_PATHS))
    elif command == "compare":
        argv += [draw(OTHER_PATHS), draw(OTHER_PATHS)]
    elif command == "experiments":
        if draw(st.booleans()):
            argv.append(draw(st.one_of(st.sampled_from(["exp", "experiments/exp.toml", "nonexistent",
                                                        "tying_equivalence"]), JUNK)))
    extra = draw(st.lists(st.sampled_from(["--results-dir", "--baseline", "--metric", "--metrics", "--tolerance",
                                           "-q", "--buggy", "--junk"]), max_size=2))
    for opt in extra:
        if opt in ("-q", "--buggy", "--junk"):
            argv.append(opt)
        else:
            argv += [opt, draw(st.one_of(st.sampled_from(["results", "baseline", "heldout_ce", "0.1", "-1", "nan",
                                                          "exact_match,heldout_ce"]), JUNK))]
    files = {"exp.toml": draw(EXPERIMENT_FILE)} if command == "experiments" else {}
    return argv, files


# ---------------------------------------------------------------------------------- the world

def _world(base: Path, template_run: Path) -> Path:
    """A fresh working directory: results/ with an existing run, a foreign and a damaged folder."""
    work = base / "w"
    (work / "experiments").mkdir(parents=True)
    shutil.copytree(template_run, work / "results" / "existing")
    (work / "results" / "foreign").mkdir()
    (work / "results" / "foreign" / "config.json").write_text(json.dumps({"hello": "world"}))
    shutil.copytree(template_run, work / "results" / "damaged")
    (work / "results" / "damaged" / "trials" / "baseline__s0.json").write_text("{ trunc")
    (work / "a_file").write_text("not a directory")
    return work


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def _call(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exc:  # argparse: --help, --version, a malformed option
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return code, out.getvalue(), err.getvalue()


def _quarantine_moves(before: dict[str, bytes], after: dict[str, bytes]) -> set[str]:
    """Paths changed by moving corrupt trial files into ``trials/quarantine/`` (file + reason)."""
    moved = set()
    for k in set(before) - set(after):
        p = Path(k)
        target = [a for a in set(after) - set(before)
                  if Path(a).parent == p.parent / "quarantine" and after[a] == before[k]]
        if p.parent.name == "trials" and target:
            moved |= {k, target[0], target[0] + ".reason"}
    return moved


def check_outcome(argv: list[str], work: Path, before: dict[str, bytes], code: int, out: str, err: str) -> None:
    """The property: exit 0 with complete folders, or exit 2 with one line and nothing written."""
    what = f"argv={argv!r}\nexit={code}\nstderr={err[-1500:]}"
    assert "Traceback" not in err, what
    after = _tree(work)
    new_runs = sorted(str(Path(k).parent) for k in set(after) - set(before) if Path(k).name == "config.json")
    outside = sorted(k for k in set(after) ^ set(before) if not k.startswith("results/")
                     and not k.startswith("experiments/"))
    assert not outside, f"written outside --results-dir: {outside}\n{what}"
    command = argv[0] if argv else ""
    allowed = {0, 2} | ({1} if command in ("verify", "compare") else set())
    assert code in allowed, what
    if code == 2:
        lines = err.strip().splitlines()
        assert lines and lines[-1].startswith("harness: error: "), what
        # the only other lines allowed: a corrupt trial file met on the way, moved to quarantine
        assert all(line.startswith("harness: warning: ") and "moved to" in line for line in lines[:-1]), what
        changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
        assert not {k for k in changed if k not in before or k not in after or "/trials/" not in k} - \
            _quarantine_moves(before, after), f"exit 2 but files changed: {sorted(changed)[:5]}\n{what}"
        return
    if command == "run" and code == 0 and "--help" not in argv:
        for run in new_runs:
            problems, _ = verify_run(RunStore(work / run))
            assert not problems, f"{run}: {problems}\n{what}"
            meta = json.loads((work / run / "config.json").read_text())
            if "trials" in meta:
                assert meta["status"] == "complete", what
                assert (work / run / "report.md").is_file(), what
        if "--resume" not in argv:
            assert len(new_runs) == 1, f"exit 0 but new runs {new_runs}\n{what}"


def test_the_fuzz_draws_every_documented_run_option():
    """Every option ``run --help`` shows is in RUN_OPTIONS; the hidden ones are exactly the old
    spellings kept as aliases (:data:`harness.runmeta.OLD_VECTORISE_FLAG`), which the fuzz draws too."""
    sub = next(a for a in cli.build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    actions = [a for a in sub.choices["run"]._actions if a.option_strings]
    documented = {a.option_strings[0] for a in actions if a.help != argparse.SUPPRESS}
    hidden = {a.option_strings[0] for a in actions if a.help == argparse.SUPPRESS}
    assert documented == (set(RUN_OPTIONS) - {"--help", OLD_VECTORISE_FLAG}) | {"-h"}
    assert hidden == {OLD_VECTORISE_FLAG} and OLD_VECTORISE_FLAG in RUN_OPTIONS


def test_fuzzed_command_lines_exit_0_or_one_line_exit_2(faked, tmp_path_factory, capsys):
    template_run = tmp_path_factory.mktemp("fuzz_run") / "existing"
    from harness import cli as _cli  # the faked executor makes this instant

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert _cli.main(["run", "--variants", "baseline,pre_norm", "--preset", "tiny", "--seeds", "2", "--jobs", "1",
                          "--results-dir", str(template_run.parent), "--run-id", "existing", "-q"]) == 0
    cases = {"n": 0, "exit0": 0, "exit2": 0, "other": 0}
    old_cwd = os.getcwd()

    @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=not os.environ.get("HARNESS_FUZZ_RANDOM"), database=None,
              suppress_health_check=list(HealthCheck),
              phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])  # no 'explain': it traces
    @given(case=st.one_of(run_argv(), run_argv(), other_argv()))
    def fuzz(case):
        argv, files = case
        cases["n"] += 1
        with tempfile.TemporaryDirectory(prefix="fz") as tmp:
            work = _world(Path(tmp), template_run)
            for name, data in files.items():
                (work / "experiments" / name).write_bytes(data)
            before = _tree(work)
            t_case = time.perf_counter()
            if os.environ.get("HARNESS_FUZZ_DEBUG"):
                with capsys.disabled():
                    print(f"start {argv!r} files={ {k: v[:300] for k, v in files.items()} }", flush=True)
            os.chdir(work)
            try:
                code, out, err = _call(argv)
            finally:
                os.chdir(old_cwd)
            cases["exit0" if code == 0 else "exit2" if code == 2 else "other"] += 1
            if os.environ.get("HARNESS_FUZZ_DEBUG"):
                with capsys.disabled():
                    print(f"{time.perf_counter() - t_case:6.2f}s exit {code} {argv[:12]!r}"[:200])
            check_outcome(argv, work, before, code, out, err)

    t0 = time.perf_counter()
    fuzz()
    wall = time.perf_counter() - t0
    with capsys.disabled():
        print(f"\n[fuzz] {cases['n']} generated command lines in {wall:.1f} s: {cases['exit0']} exit 0, "
              f"{cases['exit2']} exit 2, {cases['other']} exit 1 (verify/compare)")
    assert cases["n"] >= MIN_EXAMPLES
    assert cases["exit0"] >= 10 and cases["exit2"] >= 10  # both sides of the property were exercised


# ------------------------------------------------------------------ a few real (tiny) trainings

REAL_EXAMPLES = int(os.environ.get("HARNESS_FUZZ_REAL_EXAMPLES", "10"))

REAL_SETS = st.lists(st.one_of(
    st.sampled_from(["model.d_model=2", "model.h=2", "model.h=1", "model.d_ff=1", "model.N=2", "model.dropout=0.5",
                     "model.vocab=4", "model.max_len=64", "train.task=copy_fixed", "train.schedule=constant",
                     "train.task=reverse", "train.task=sort", "train.task=copy_length", "train.seq_len=2",
                     "train.seq_len=1", "train.seq_len=3", "train.batch=1", "train.eval_every=0",
                     "train.eval_every=1", "train.eval_sequences=1", "train.label_smoothing=0.9",
                     "train.grad_clip=0.5", "train.stop_at_solved=True", "train.noam_factor=1000.0", "train.warmup=1",
                     "train.schedule=cosine", "train.schedule=wsd", "train.schedule=linear", "train.lr=0.01",
                     "train.optimizer=adamw", "train.weight_decay=0.5", "train.decay_all=True", "train.min_lr=0.001"]),
    st.integers(1, 3).map(lambda n: f"train.steps={n}")), max_size=5)


def test_fuzzed_configs_train_for_real(tmp_path_factory, capsys):
    """Real tiny trainings with generated config overrides: exit 0, exit 2 (one line, no folder),
    or exit 1 only for a trial that diverged -- a trial that *failed* would be a harness bug."""
    cases = {"n": 0}

    @settings(max_examples=REAL_EXAMPLES, deadline=None, derandomize=not os.environ.get("HARNESS_FUZZ_RANDOM"),
              database=None, suppress_health_check=list(HealthCheck),
              phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink])
    @given(sets=REAL_SETS, variant=st.sampled_from(["baseline", "pre_norm", "d2l_attention", "seed_001"]))
    @example(sets=["train.task=copy_fixed", "train.seq_len=1"], variant="baseline")  # was a ZeroDivisionError
    @example(sets=["model.d_model=2", "model.h=2", "model.d_ff=1", "train.noam_factor=1000.0"], variant="seed_001")
    @example(sets=["train.schedule=cosine", "train.warmup=1", "train.optimizer=adamw", "train.lr=0.01"],
             variant="pre_norm")
    def real(sets, variant):
        cases["n"] += 1
        results = tmp_path_factory.mktemp("real")
        argv = ["run", "--variants", variant, "--preset", "tiny", "--set", "train.steps=2", "--jobs", "1",
                "--threads", "1", "--device", "cpu", "--results-dir", str(results), "--run-id", "r", "-q"]
        for item in sets:
            argv += ["--set", item]
        code, out, err = _call(argv)
        what = f"argv={argv!r}\nexit={code}\nstderr={err[-1500:]}"
        assert "Traceback" not in err and code in (0, 1, 2), what
        if code == 2:
            assert len(err.strip().splitlines()) == 1 and not (results / "r").exists(), what
            return
        row = json.loads(next((results / "r" / "trials").glob("*.json")).read_text())["row"]
        assert row["status"] == ("ok" if code == 0 else "diverged"), f"{row.get('reason')}\n{what}"
        assert not verify_run(RunStore(results / "r"))[0], what

    t0 = time.perf_counter()
    real()
    with capsys.disabled():
        print(f"\n[fuzz] {cases['n']} real tiny trainings in {time.perf_counter() - t0:.1f} s")
    assert cases["n"] >= min(REAL_EXAMPLES, 8)
