"""End-to-end: the CLI as a user runs it, in a subprocess."""
import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from .conftest import EXAMPLE_PLUGIN, ROOT, cli_in_process


def harness(*args, cwd=None):
    env = {**os.environ, "HARNESS_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True,
                          cwd=cwd or ROOT, env=env, timeout=300)


def test_run_tiny_writes_every_file(tmp_path):
    r = harness("run", "--variants", "baseline", "pre_norm", "--preset", "tiny", "--seeds", "2",
                "--results-dir", str(tmp_path), "--run-id", "t", "--quiet", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    run = tmp_path / "t"
    for name in ("config.json", "trials.csv", "curves.csv", "report.md", "curves.png"):
        assert (run / name).is_file(), name
    meta = json.loads((run / "config.json").read_text())
    assert meta["config"]["model"]["d_model"] == 16 and meta["seeds"] == [0, 1]
    assert meta["environment"]["torch"] and meta["environment"]["threads"] >= 1
    trials = pd.read_csv(run / "trials.csv")
    assert sorted(zip(trials.variant, trials.seed)) == [("baseline", 0), ("baseline", 1), ("pre_norm", 0), ("pre_norm", 1)]
    for col in ("slot_norm", "slot_embedding", "slot_attention", "slot_mask", "params", "steps", "final_train_loss",
                "heldout_ce", "heldout_token_acc", "exact_match", "wall_s", "tokens_per_s", "peak_mem_mb", "status"):
        assert col in trials.columns, col
    assert set(trials.status) == {"ok"}
    assert (trials.steps == 20).all()
    assert trials.exact_match.between(0, 1).all()
    assert set(trials.slot_norm) == {"post", "pre"}
    curves = pd.read_csv(run / "curves.csv")
    assert set(curves.split) == {"train", "dev"}
    assert len(curves[(curves.split == "train") & (curves.variant == "baseline") & (curves.seed == 0)]) == 20
    report = (run / "report.md").read_text()
    assert "pre_norm" in report and "| variant" in report and "python -m harness run" in report
    assert "| baseline" in r.stdout  # the table is printed too


def test_list_shows_slots_variants_and_plugins():
    r = cli_in_process("list")
    assert r.returncode == 0, r.stderr
    for word in ("norm", "attention", "d2l", "baseline", "seed_004", "variants.presets"):
        assert word in r.stdout
    assert "bug_001_discarded_mask" not in r.stdout
    assert "bug_001_discarded_mask" in cli_in_process("list", "--buggy").stdout


#: where ``list`` is run with the example plugin: a short path given relative to the working
#: directory, and an absolute one far longer than any checkout's (its wrapped marker spans lines)
PLUGIN_PATHS = {"short": "p.py", "long": "d" * 90 + "/harness_example_at_a_path_longer_than_a_checkout.py"}


@pytest.mark.parametrize("where", sorted(PLUGIN_PATHS))
def test_list_fits_120_columns_and_marks_what_a_plugin_offers(registry, tmp_path, monkeypatch, where):
    """Every line of ``list --buggy`` with a plugin file loaded is at most 120 characters, every
    variant and task name is there whole, and only what the plugin offers is marked ``[plugin ...]``,
    wherever the plugin file lies: the marker holds the plugin's path, which wraps differently with
    its length, so the plugin is copied to a path of known length (not the checkout's) and the
    marker is read wherever its row's lines break it."""
    plugin = tmp_path / PLUGIN_PATHS[where]
    plugin.parent.mkdir(parents=True, exist_ok=True)
    plugin.write_text(EXAMPLE_PLUGIN.read_text())
    monkeypatch.setenv("COLUMNS", "120")
    given = PLUGIN_PATHS[where] if where == "short" else str(plugin)
    r = cli_in_process("--plugin", given, "list", "--buggy", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert max(map(len, lines)) <= 120
    first_cells = {line.split("|")[1].strip() for line in lines if line.startswith("| ")}
    from harness.config import PRESET_NOTES
    for name in [*registry.variants, *registry.tasks, *PRESET_NOTES]:
        assert any(cell.startswith(name) for cell in first_cells), name
    preset_help = cli_in_process("run", "--help").stdout.split("  --preset NAME", 1)[1].split("  --set", 1)[0]
    assert len(preset_help.splitlines()) <= 4 and "python -m harness list" in " ".join(preset_help.split())
    known = {*registry.variants, *registry.tasks, *(name for _, name in registry.components), "example_rmsnorm", "rms"}
    marked, row = set(), None
    for line in lines:
        if not line.startswith("| "):
            row = None
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        first = (cells[1] if cells[0] in registry.slots else cells[0]).split()
        if first and first[0] in known:  # a row starts; the lines after it without a name continue it
            row = first[0]
        if row and "[plugin" in line:
            marked.add(row)
    assert marked == {"example_rmsnorm", "rms"}, marked
    if where == "short":
        assert "[plugin p.py]" in r.stdout  # the marker names the file as given
    assert "variants.presets" in r.stdout  # the footnote names the built-in modules


def test_example_plugin_file_list_and_run(tmp_path):
    r = cli_in_process("--plugin", str(EXAMPLE_PLUGIN), "list")
    assert r.returncode == 0, r.stderr
    assert "example_rmsnorm" in r.stdout and "rms" in r.stdout
    r = cli_in_process("--plugin", str(EXAMPLE_PLUGIN), "run", "--variants", "example_rmsnorm", "--preset", "tiny",
                "--results-dir", str(tmp_path), "--quiet")
    assert r.returncode == 0, r.stderr
    trials = pd.read_csv(next(tmp_path.glob("*/trials.csv")))
    assert trials.loc[0, "variant"] == "example_rmsnorm" and trials.loc[0, "slot_layer_norm"] == "rms"


def test_example_plugin_module_with_p():
    env_path = str(EXAMPLE_PLUGIN.parent)
    env = {**os.environ, "HARNESS_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONPATH": f"{env_path}{os.pathsep}{ROOT}"}
    r = subprocess.run([sys.executable, "-m", "harness", "-p", "harness_example", "list"], capture_output=True,
                       text=True, cwd=ROOT, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "example_rmsnorm" in r.stdout and "harness_example" in r.stdout


@pytest.mark.parametrize("args, needle", [
    (["run", "--variants", "baselin"], "did you mean 'baseline'"),
    (["run", "--set", "model.d_model=30", "--set", "model.h=4"], "divisible by h"),
    (["run", "--preset", "quik"], "unknown preset 'quik'"),
], ids=["unknown-variant", "d_model-not-divisible", "bad-preset"])
def test_bad_input_one_line_exit_2(args, needle, tmp_path):
    r = cli_in_process(*args, "--results-dir", str(tmp_path))
    assert r.returncode == 2
    assert needle in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir()), "bad input must not create a run"


def test_help_imports_neither_torch_nor_pandas():
    """``python -m harness --help`` imports only the CLI (not a timed test: -X importtime lists
    every module imported)."""
    env = {**os.environ, "HARNESS_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "harness", "--help"], capture_output=True,
                       text=True, cwd=ROOT, env=env, timeout=120)
    assert r.returncode == 0 and "COMMAND" in r.stdout, r.stderr[-2000:]
    imported = {line.split("|")[-1].strip().split(".")[0] for line in r.stderr.splitlines()
                if line.startswith("import time:")}
    assert "harness" in imported
    assert not imported & {"torch", "pandas", "numpy", "matplotlib", "scipy"}, sorted(imported)


def test_command_table_help_is_each_commands_own():
    """cli.COMMANDS (the --help listing, without importing the commands) says what each command's
    own register() says, and the lazily built parser lists the same commands."""
    from harness import cli

    def choices(parser):
        sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        return {a.dest: a.help for a in sub._choices_actions}

    full = choices(cli.build_parser())
    assert full == dict(cli.COMMANDS)
    assert choices(cli.build_parser(commands=())) == full
    assert cli.build_parser().format_help() == cli.build_parser(commands=()).format_help()


def _all_parsers(parser, prog=""):
    """Every (prog, parser) under ``parser``: each command and, recursively, each sub-command."""
    yield prog or parser.prog, parser
    for action in parser._actions:
        if action.__class__.__name__ == "_SubParsersAction":
            for name, child in action.choices.items():
                yield from _all_parsers(child, f"{prog} {name}".strip())


def test_every_help_renders_clean():
    """Every command's and sub-command's ``--help`` renders: no argparse internals leak into the
    text (an unescaped ``%`` in a help string interpolates argparse's dict: ``option_strings``,
    ``<argparse._ArgumentGroup object ...>``) and no format error is raised."""
    from harness import cli

    parsers = list(_all_parsers(cli.build_parser()))
    assert len(parsers) > len(cli.COMMANDS), [p for p, _ in parsers]
    for prog, parser in parsers:
        text = parser.format_help()   # raises ValueError/TypeError/KeyError on a bad format
        for leak in ("option_strings", "<argparse.", "%("):
            assert leak not in text, f"{prog or 'harness'} --help shows {leak!r}"


def test_a_reader_that_stops_early_gets_no_traceback():
    """``python -m harness list | head -1``: the command stops quietly with exit 141 (128 + SIGPIPE)."""
    fcntl = pytest.importorskip("fcntl")
    if not hasattr(fcntl, "F_SETPIPE_SZ"):
        pytest.skip("needs Linux's F_SETPIPE_SZ to make the pipe smaller than the output")
    from harness.cli import BROKEN_PIPE

    proc = subprocess.Popen([sys.executable, "-m", "harness", "list", "--buggy"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT, env={**os.environ, "HARNESS_DISABLE_PLUGIN_AUTOLOAD": "1"})
    fcntl.fcntl(proc.stdout.fileno(), fcntl.F_SETPIPE_SZ, 4096)  # the ~28 kB of output cannot all fit in the pipe
    assert proc.stdout.readline().startswith(b"Components")
    proc.stdout.close()  # the reader goes away before the rest is written
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == BROKEN_PIPE and err == "", err


@pytest.mark.parametrize("thread", [False, True])
def test_the_quick_exit_keeps_output_atexit_handlers_and_waits_for_threads(tmp_path, thread):
    """``python -m harness`` ends by ``os._exit`` after the atexit handlers (``harness.cli.exit_now``): the
    interpreter's module teardown is skipped. A plugin's atexit handler still runs, the whole output
    (a pipe, so block-buffered) arrives, and a non-daemon thread the plugin left running is waited for:
    the ordinary exit, whose result it writes half a second after the command is done."""
    plugin = tmp_path / "late_plugin.py"
    plugin.write_text(
        "import atexit, pathlib, threading, time\n"
        "from harness import hookimpl\n"
        f"OUT = pathlib.Path({str(tmp_path)!r})\n"
        "def late():\n"
        "    time.sleep(0.5)\n"
        "    (OUT / 'thread.txt').write_text('done')\n"
        f"if {thread}:\n"
        "    threading.Thread(target=late).start()\n"
        "atexit.register(lambda: (OUT / 'atexit.txt').write_text('ran'))\n"
        "@hookimpl\n"
        "def harness_add_variants():\n"
        "    return []\n")
    env = {**os.environ, "HARNESS_DISABLE_PLUGIN_AUTOLOAD": "1"}
    args = ["--plugin", str(plugin), "list", "--buggy"]
    ordinary = subprocess.run([sys.executable, "-c", "import sys; from harness.cli import main; sys.exit(main())",
                               *args], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    for marker in tmp_path.glob("*.txt"):
        marker.unlink()
    proc = subprocess.run([sys.executable, "-m", "harness", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == ordinary.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == ordinary.stdout and len(proc.stdout) > 10_000  # nothing lost in the pipe's buffer
    assert proc.stderr == ordinary.stderr
    assert (tmp_path / "atexit.txt").read_text() == "ran"
    assert (tmp_path / "thread.txt").exists() == thread
    bad = subprocess.run([sys.executable, "-m", "harness", "run", "--variants", "no_such_variant"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("harness: error:")


@pytest.mark.parametrize("error, code, expected", [("BrokenPipeError()", 0, 141), ("OSError(28, 'full')", 0, 120),
                                                   ("OSError(28, 'full')", 3, 3), (None, 0, 0)])
def test_the_quick_exit_reports_a_failed_last_flush(error, code, expected):
    """``exit_now``: a last flush that fails turns a success into 141 (the reader went away, as ``main``
    reports it) or 120 (another error, as Python's own exit does); a failure's code stays."""
    flush = f"raise {error}" if error else "pass"
    script = ("import io, sys\n"
              "from harness.cli import exit_now\n"
              "class Out(io.StringIO):\n"
              f"    def flush(self): {flush}\n"
              "sys.stdout = Out()\n"
              f"exit_now({code})\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == expected, proc.stderr[-2000:]
