"""The bad-input catalogue: every case runs the CLI in a process of its own and must exit with
code 2 and one line on stderr naming what was wrong, without a traceback and without
touching anything already stored.

Starting ``python -m harness`` costs ~3 s of imports (torch, pandas, scipy), so the catalogue
runs in one driver subprocess that imports ``harness.cli`` once and forks one child per case;
each child runs ``harness.cli.main(argv)`` exactly as ``python -m harness`` does (``sys.exit(main())``)
with its own stdout/stderr files and exit status. A few cases also run as plain
``python -m harness`` subprocesses and must give the same result.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from harness.config import get_preset
from harness.errors import ConfigError
from harness.runner import make_specs
from harness.registry import Registry
from harness.store import RunStore, config_hash

# its module-scoped fixture is built once: under ``pytest -n 2 --dist loadgroup`` the module stays on one worker
pytestmark = pytest.mark.xdist_group("bad_input")

ROOT = Path(__file__).resolve().parents[1]


def harness_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "HARNESS_DISABLE_PLUGIN_AUTOLOAD": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


PLUGINS = {
    "bad_slot.py": """
        from harness import Variant, hookimpl

        @hookimpl
        def harness_add_variants():
            return [Variant("typo_slot", {"nrom": "pre"})]
    """,
    "bad_component.py": """
        from harness import Variant, hookimpl

        @hookimpl
        def harness_add_variants():
            return [Variant("typo_component", {"norm": "pree"})]
    """,
    "hook_raises.py": """
        from harness import hookimpl

        @hookimpl
        def harness_add_variants():
            raise ValueError("this hook is broken on purpose")
    """,
    "wrong_types.py": """
        from harness import hookimpl

        @hookimpl
        def harness_add_variants():
            return ["not a Variant"]
    """,
    "import_fails.py": """
        import a_module_that_does_not_exist_anywhere
    """,
}


def _resumable_run(root: Path, config_hash_value: str | None = None) -> Path:
    """A run folder as ``run`` writes it (1 trial, tiny preset), made without training."""
    cfg = get_preset("tiny")
    reg = Registry.from_plugins()
    plugins = {"modules": [], "files": [], "strict": False}
    specs = make_specs([reg.variants["baseline"]], [0], cfg, "cpu", "fp32", plugins, threads=1)
    meta = {"command": "python -m harness run --variants baseline --preset tiny", "preset": "tiny",
            "experiment": "", "config": cfg.to_dict(), "points": {},
            "config_hash": config_hash_value or config_hash(cfg.to_dict()), "variants": ["baseline"],
            "seeds": [0], "device": "cpu", "dtype": "fp32", "plugins": plugins,
            "execution": {"executor": "local", "jobs": 1, "threads": 1, "address": None},
            "trials": [{"key": s.key, "spec": s.to_dict()} for s in specs], "run_id": root.name}
    (root / "trials").mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(meta, indent=2))
    return root


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _catalogue(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """case id -> (argv, text the one-line message must contain)."""
    plugins = {}
    for name, text in PLUGINS.items():
        plugins[name] = tmp / name
        plugins[name].write_text(textwrap.dedent(text))
    results = tmp / "results"  # holds one existing run that no case may touch
    _resumable_run(results / "existing")
    foreign = tmp / "foreign"
    foreign.mkdir()
    (foreign / "config.json").write_text(json.dumps({"hello": "world"}))
    unreadable = tmp / "unreadable"
    unreadable.mkdir()
    (unreadable / "config.json").write_text("{ this is not json")
    tampered = _resumable_run(tmp / "tampered", config_hash_value="000000000000")
    busy = _resumable_run(tmp / "busy")  # the fixture holds its lock while the cases run
    not_a_run = tmp / "not_a_run"
    not_a_run.mkdir()
    a_file = tmp / "a_file"
    a_file.write_text("not a directory")
    bad_toml = tmp / "broken_experiment.toml"
    bad_toml.write_text("description = \n[[[ not toml")
    binary_toml = tmp / "binary.toml"
    binary_toml.write_bytes(b'description = "caf\xe9"\nvariants = ["baseline"]\nseeds = 1\n\x89PNG\r\n\x1a\n\x00\xff')
    bad_name_toml = tmp / "bad_name.toml"
    bad_name_toml.write_text('name = "../../escaped"\ndescription = "x"\nvariants = ["baseline"]\nseeds = 1\n')

    base = ["run", "--variants", "baseline", "--preset", "tiny", "--results-dir", str(results), "-q"]
    existing = str(results / "existing")
    cases = {
        "unknown_variant": (["run", "--variants", "basline", "--results-dir", str(results)],
                            "unknown variant 'basline'; did you mean 'baseline'"),
        "unknown_variant_glob": (["run", "--variants", "nothing_like_this*", "--results-dir", str(results)],
                                 "no variant matches it"),
        "unknown_slot": (["--plugin", str(plugins["bad_slot.py"]), *base], "unknown slot 'nrom'; did you mean 'norm'"),
        "unknown_component": (["--plugin", str(plugins["bad_component.py"]), *base],
                              "unknown norm component 'pree'; did you mean 'pre'"),
        "set_wrong_type": ([*base, "--set", "model.N=two"], "N must be int"),
        "set_out_of_range": ([*base, "--set", "train.steps=0"], "steps must be >= 1"),
        "set_d_model_not_divisible_by_h": ([*base, "--set", "model.d_model=30", "--set", "model.h=4"],
                                           "d_model must be divisible by h"),
        "set_vocab_too_small": ([*base, "--set", "model.vocab=2"], "vocab must be >= 3"),
        "set_unknown_key": ([*base, "--set", "model.dmodel=32"], "did you mean 'model.d_model'"),
        "set_alias_learning_rate": ([*base, "--set", "train.learning_rate=1"],
                                    "'learning_rate' is called 'train.lr' here (the peak learning rate of every "
                                    "schedule but noam, which takes train.noam_factor)"),
        "set_alias_factor": ([*base, "--set", "train.factor=1"],
                             "'factor' is called 'train.noam_factor' here (the Noam factor, not a learning rate"),
        "set_bare_lr": ([*base, "--set", "lr=0.5"], "config key 'lr' needs its section; did you mean 'train.lr'"),
        "set_lr_with_noam": ([*base, "--set", "train.lr=0.001"],
                             "train.lr=0.001 is a peak learning rate, which the noam schedule does not take (train.lr "
                             "once set the Noam factor: a peak step size of 0.001 * 16^-0.5 * 10^-0.5 = 7.91e-05); "
                             "for a peak of 0.001 set train.noam_factor=0.01265, or keep train.lr and choose "
                             "train.schedule=cosine, linear, wsd or constant"),
        "set_weight_decay_with_adam": ([*base, "--set", "train.weight_decay=0.1"],
                                       "adam takes none: set train.optimizer=adamw"),
        "set_unknown_schedule": ([*base, "--set", "train.schedule=cosin"],
                                 "schedule must be one of noam, constant, cosine, linear, wsd, got 'cosin'"),
        "set_min_lr_with_noam": ([*base, "--set", "train.min_lr=0.0001"], "the noam schedule does not decay to it"),
        "set_warmup_past_the_end": ([*base, "--set", "train.schedule=cosine", "--set", "train.warmup=20"],
                                    "the cosine schedule's warm-up (20 steps) must end before its decay starts"),
        "set_alias_heads": ([*base, "--set", "model.heads=2"], "'heads' is called 'model.h' here"),
        "set_alias_layers": ([*base, "--set", "model.layers=2"], "'layers' is called 'model.N' here"),
        "set_alias_d_ffn": ([*base, "--set", "model.d_ffn=64"], "'d_ffn' is called 'model.d_ff' here"),
        "set_key_in_other_section": ([*base, "--set", "train.d_model=32"], "did you mean 'model.d_model'?"),
        "set_key_without_section": ([*base, "--set", "steps=5"], "config key 'steps' needs its section; did you "
                                                                   "mean 'train.steps'?"),
        "check_set_alias": (["check", "--variants", "baseline", "--set", "num_heads=2", "--results-dir",
                             str(results)], "'num_heads' is called 'model.h' here"),
        "set_malformed": ([*base, "--set", "train.steps"], "--set expects KEY=VALUE"),
        "seeds_zero": ([*base, "--seeds", "0"], "--seeds must be >= 1"),
        "unknown_preset": (["run", "--preset", "quik", "--results-dir", str(results)],
                           "unknown preset 'quik'; did you mean 'quick'"),
        "unknown_experiment": (["run", "--experiment", "nonexistent", "--results-dir", str(results)], "experiment"),
        "malformed_experiment": (["run", "--experiment", str(bad_toml), "--results-dir", str(results)], "experiment"),
        "results_dir_is_a_file": (["run", "--variants", "baseline", "--preset", "tiny", "--results-dir", str(a_file)],
                                  "cannot write results directory"),
        "results_dir_unwritable": (["run", "--variants", "baseline", "--preset", "tiny", "--results-dir",
                                    "/proc/harness-results" if os.geteuid() == 0 else str(tmp / "readonly")],
                                   "cannot write results directory"),
        "resume_missing_run": (["run", "--resume", str(tmp / "no_such_run")], "no run at"),
        "resume_not_a_run": (["run", "--resume", str(not_a_run)], "is not a run directory (no config.json)"),
        "resume_foreign_run": (["run", "--resume", str(foreign)], "is not a resumable run"),
        "resume_unreadable_config": (["run", "--resume", str(unreadable)], "is not valid JSON"),
        "resume_code_config_hash_mismatch": (["run", "--resume", str(tampered)], "config hash mismatch"),
        "resume_requested_config_mismatch": (["run", "--resume", existing, "--set", "train.steps=21"],
                                             "train.steps: stored 20, requested 21"),
        "resume_requested_preset_mismatch": (["run", "--resume", existing, "--preset", "quick"],
                                             "requested config hash"),
        "resume_requested_trials_mismatch": (["run", "--resume", existing, "--seeds", "2"],
                                             "requested trials differ from the stored ones"),
        "resume_other_device": (["run", "--resume", existing, "--dtype", "bf16"], "--dtype stored 'fp32'"),
        "resume_run_being_written": (["run", "--resume", str(busy)], "is being written by another process"),
        "plugin_file_missing": (["--plugin", str(tmp / "no_such_plugin.py"), *base], "does not exist"),
        "plugin_module_missing": (["-p", "no_such_plugin_module", *base], "not found"),
        "plugin_import_fails": (["--plugin", str(plugins["import_fails.py"]), *base], "failed to import"),
        "plugin_hook_raises_strict": (["--strict-plugins", "--plugin", str(plugins["hook_raises.py"]), *base],
                                      "harness_add_variants() raised ValueError"),
        "plugin_wrong_types": (["--plugin", str(plugins["wrong_types.py"]), *base],  # an error, strict or not
                               "wrong_types.py:5: harness_add_variants() must return a list of Variant"),
        "set_pad_not_0": ([*base, "--set", "model.pad=3"], "model.pad must be 0"),
        "run_id_traversal": ([*base, "--run-id", "../../escaped"], "run id '../../escaped' contains a path separator"),
        "run_id_absolute": ([*base, "--run-id", str(tmp / "escaped")], "contains a path separator"),
        "run_id_dotdot": ([*base, "--run-id", ".."], "run id '..' contains '..'"),
        "run_id_empty": ([*base, "--run-id", ""], "run id must not be empty"),
        "run_id_hidden": ([*base, "--run-id", ".hidden"], "starts with '.'"),
        "run_id_taken": ([*base, "--run-id", "existing"], "run id 'existing' already exists"),
        "check_run_id_traversal": (["check", "--variants", "baseline", "--results-dir", str(results), "--run-id",
                                    "../escaped"], "contains a path separator"),
        "experiment_not_utf8": (["run", "--experiment", str(binary_toml), "--results-dir", str(results)],
                                "binary.toml: not a text file in UTF-8"),
        "experiment_name_is_a_path": (["run", "--experiment", str(bad_name_toml), "--results-dir", str(results)],
                                      "key 'name': experiment name '../../escaped' contains a path separator"),
        "seed_start_negative": ([*base, "--seed-start", "-1"], "--seed-start must be >= 0, got -1"),
        "too_many_trials": (["run", "--variants", "all", "--seeds", "1000000000", "--results-dir", str(results)],
                            "at most 10000 per run"),
        "threads_too_many": ([*base, "--threads", "100000"], "--threads must be between 1 and 1024"),
        "results_dir_empty": (["run", "--variants", "baseline", "--preset", "tiny", "--results-dir", ""],
                              "--results-dir must not be empty"),
        "experiment_with_variants": (["run", "--experiment", "tying_equivalence", "--variants", "pre_norm",
                                      "--results-dir", str(results)], "--variants cannot be combined with --experiment"),
        "argparse_value_with_newline": (["run", "--results-dir", str(results), "stray\r\nargument"],
                                        "unrecognized arguments: stray\\r\\nargument"),
        "jobs_zero": ([*base, "--jobs", "0"], "--jobs must be 'auto' or >= 1"),
        "address_without_ray": ([*base, "--address", "127.0.0.1:6379"], "needs --executor ray"),
        "capture_on_cpu": ([*base, "--device", "cpu", "--capture", "on"], "--capture on needs a CUDA device"),
        "capture_on_not_vectorised": ([*base, "--capture", "on", "--vectorise-seeds", "off"],
                                      "it needs --vectorise-seeds on or auto"),
        "unknown_command_suite": (["suite", "modern"], "unknown command 'suite'; did you mean: run --suite NAME?"),
        "unknown_command_typo": (["chekc", "--variants", "all"], "unknown command 'chekc'; did you mean: check?"),
    }
    if os.geteuid() != 0:
        (tmp / "readonly").mkdir()
        (tmp / "readonly").chmod(0o500)
    if not torch.cuda.is_available():
        cases["device_cuda_without_cuda"] = ([*base, "--device", "cuda"], "CUDA is not available")
    if importlib.util.find_spec("ray") is None:
        cases["executor_ray_not_installed"] = ([*base, "--executor", "ray"], "pip install -e '.[ray]'")
    return cases


CASE_IDS = [  # the fixture builds each case's paths; the ids are fixed here for parametrize
    "unknown_variant", "unknown_variant_glob", "unknown_slot", "unknown_component", "set_wrong_type",
    "set_out_of_range", "set_d_model_not_divisible_by_h", "set_vocab_too_small", "set_unknown_key",
    "set_alias_learning_rate", "set_alias_factor", "set_bare_lr", "set_lr_with_noam", "set_weight_decay_with_adam",
    "set_unknown_schedule", "set_min_lr_with_noam", "set_warmup_past_the_end", "set_alias_heads", "set_alias_layers",
    "set_alias_d_ffn",
    "set_key_in_other_section", "set_key_without_section", "check_set_alias",
    "set_malformed", "seeds_zero", "unknown_preset", "unknown_experiment", "malformed_experiment",
    "results_dir_is_a_file", "results_dir_unwritable", "resume_missing_run", "resume_not_a_run",
    "resume_foreign_run", "resume_unreadable_config", "resume_code_config_hash_mismatch",
    "resume_requested_config_mismatch", "resume_requested_preset_mismatch", "resume_requested_trials_mismatch",
    "resume_other_device", "resume_run_being_written",
    "plugin_file_missing", "plugin_module_missing", "plugin_import_fails", "plugin_hook_raises_strict",
    "plugin_wrong_types", "jobs_zero", "address_without_ray",
    "set_pad_not_0", "run_id_traversal", "run_id_absolute", "run_id_dotdot", "run_id_empty", "run_id_hidden",
    "run_id_taken", "check_run_id_traversal", "experiment_not_utf8", "experiment_name_is_a_path",
    "seed_start_negative", "too_many_trials", "threads_too_many", "results_dir_empty", "experiment_with_variants",
    "argparse_value_with_newline", "capture_on_cpu", "capture_on_not_vectorised", "unknown_command_suite",
    "unknown_command_typo"]
if not torch.cuda.is_available():
    CASE_IDS.append("device_cuda_without_cuda")
if importlib.util.find_spec("ray") is None:
    CASE_IDS.append("executor_ray_not_installed")


FORKING_DRIVER = r"""
import json, os, sys, traceback
import harness.cli
from harness.registry import Registry
harness.cli.build_parser()  # imports every sub-command (torch, pandas, scipy) once, before forking
Registry.from_plugins()  # imports the built-in plugin modules once
cases, outdir = json.load(sys.stdin), sys.argv[1]
status = {}
for cid, argv in cases.items():
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        for fd, name in ((1, "out"), (2, "err")):
            os.dup2(os.open(os.path.join(outdir, f"{cid}.{name}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        sys.argv = ["harness", *argv]
        try:
            code = harness.cli.main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(int(code or 0))
    status[cid] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
json.dump(status, open(os.path.join(outdir, "status.json"), "w"))
"""


def run_forked(cases: dict[str, list[str]], outdir: Path) -> dict[str, subprocess.CompletedProcess]:
    """Run each argv through ``harness.cli.main`` in a forked child of one driver subprocess."""
    outdir.mkdir()
    env = {**os.environ, "HARNESS_DISABLE_PLUGIN_AUTOLOAD": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    driver = subprocess.run([sys.executable, "-c", FORKING_DRIVER, str(outdir)], input=json.dumps(cases),
                            capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert driver.returncode == 0, driver.stderr
    status = json.loads((outdir / "status.json").read_text())
    return {cid: subprocess.CompletedProcess(argv, status[cid], (outdir / f"{cid}.out").read_text(),
                                             (outdir / f"{cid}.err").read_text())
            for cid, argv in cases.items()}


#: cases also run as plain ``python -m harness`` subprocesses (must match the forked run)
PLAIN_SUBPROCESS = ("unknown_variant", "set_out_of_range", "resume_foreign_run", "run_id_traversal",
                    "experiment_not_utf8")


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    if not hasattr(os, "fork"):
        pytest.skip("the forking driver needs os.fork (POSIX)")
    tmp = tmp_path_factory.mktemp("bad_input")
    cases = _catalogue(tmp)
    assert sorted(cases) == sorted(CASE_IDS)
    before = _snapshot(tmp / "results")
    with RunStore(tmp / "busy").lock():  # as if another process were writing that run
        forked = run_forked({cid: argv for cid, (argv, _) in cases.items()}, tmp / "outputs")
    with ThreadPoolExecutor(max_workers=2) as pool:
        plain = dict(zip(PLAIN_SUBPROCESS, pool.map(lambda cid: harness_cli(*cases[cid][0]), PLAIN_SUBPROCESS)))
    return {"cases": {cid: (forked[cid], expected) for cid, (_, expected) in cases.items()}, "plain": plain,
            "results_before": before, "results_after": _snapshot(tmp / "results"), "tmp": tmp}


@pytest.mark.parametrize("case", CASE_IDS)
def test_bad_input_is_one_line_exit_2(outcomes, case):
    proc, expected = outcomes["cases"][case]
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("harness: error: "), lines[0]
    assert expected in lines[0], lines[0]


@pytest.mark.parametrize("case", PLAIN_SUBPROCESS)
def test_plain_python_m_harness_gives_the_same(outcomes, case):
    plain, forked = outcomes["plain"][case], outcomes["cases"][case][0]
    assert (plain.returncode, plain.stderr) == (forked.returncode, forked.stderr)


def test_nothing_stored_was_touched(outcomes):
    """No case wrote into the results directory holding an existing run."""
    assert outcomes["results_after"] == outcomes["results_before"]
    assert sorted(p.name for p in (outcomes["tmp"] / "results").iterdir()) == ["existing"]
    # and nothing outside it: no run id or experiment name reached another folder
    tmp = outcomes["tmp"]
    assert not [p for p in (tmp, tmp.parent, tmp.parent.parent) for q in p.glob("escaped*")]


def test_the_same_plugin_file_named_twice_is_loaded_once():
    """Found by the fuzz test: pluggy refused the second registration with a traceback."""
    plugin = str(ROOT / "examples" / "harness-example" / "harness_example.py")
    proc = harness_cli("--plugin", plugin, "--plugin", plugin, "list")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("example_rmsnorm") == 1


def test_broken_plugin_warns_with_its_name_unless_strict(tmp_path):
    """Without --strict-plugins a raising hook is a warning naming the plugin file and the command
    goes on (exit 0); with it, it aborts (see the catalogue). Wrong return types from a file named
    with --plugin abort either way (the catalogue's plugin_wrong_types)."""
    f = tmp_path / "hook_raises.py"
    f.write_text(textwrap.dedent(PLUGINS["hook_raises.py"]))
    proc = harness_cli("--plugin", str(f), "list")
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("harness: warning: ")]
    assert len(warnings) == 1 and str(f) in warnings[0] and "raised ValueError" in warnings[0], proc.stderr
    assert "baseline" in proc.stdout


# ---- --set keys: aliases and closest keys (harness.config.resolve_key), without a subprocess ----

def test_every_alias_names_a_real_key_and_shadows_none():
    """An alias that pointed at a key that does not exist would send the user to a second error; one
    that equals a real key name would make that key unreachable."""
    from harness.config import config_keys, resolve_key
    from harness.settings import ALIASES

    keys = set(config_keys())
    assert set(ALIASES.values()) <= keys
    assert not set(ALIASES) & {k.partition(".")[2] for k in keys}
    for alias, target in ALIASES.items():
        section = target.partition(".")[0]
        with pytest.raises(ConfigError, match=f"is called '{target}' here"):
            resolve_key(f"{section}.{alias}")


@pytest.mark.parametrize("key,want", [
    ("train.lr", ("train", "lr")),  # the peak learning rate, no longer an old name of noam_factor
    ("model.N", ("model", "N")), ("train.noam_factor", ("train", "noam_factor")),
])
def test_known_keys_resolve(key, want):
    from harness.config import resolve_key

    assert resolve_key(key) == want


def test_unknown_key_without_any_close_key_lists_the_keys():
    from harness.config import resolve_key

    with pytest.raises(ConfigError) as err:
        resolve_key("model.zzzz")
    msg = str(err.value)
    assert msg.startswith("unknown config key 'model.zzzz'; keys: model.N, model.d_model") and "\n" not in msg


def test_an_alias_is_never_applied_silently():
    """``learning_rate=1e-3`` must not become a Noam factor of 1e-3 (a step size ~1000x too small), and
    ``train.lr`` is never read as one: with the noam schedule it is refused, elsewhere it is the peak."""
    cfg = get_preset("tiny")
    with pytest.raises(ConfigError):
        cfg.override({"train.learning_rate": 1e-3})
    with pytest.raises(ConfigError):
        cfg.override({"train.lr": 0.5})
    cosine = cfg.override({"train.lr": 0.5, "train.schedule": "cosine"})
    assert cosine.train.lr == 0.5 and cosine.train.noam_factor == cfg.train.noam_factor
