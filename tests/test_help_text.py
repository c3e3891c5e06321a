"""Every ``--help`` page is plain text: no Markdown or reStructuredText markup, no internal names.

The pages are rendered through ``cli.main`` for ``python -m harness --help`` and for every
sub-command the parser knows (taken from the parser, so a new command is covered without editing
this file).
"""
import argparse
import re

import pytest

import harness
from harness import cli
from harness.config import DEFAULT_PRESET, PRESETS

#: (what is wrong, pattern) for a help page; each pattern is tried on every line.
MARKUP = [
    ("backticks", re.compile(r"`")),
    ("bold markup", re.compile(r"\*\*|(?<![\w<>])__[A-Za-z][^_\n]*__(?!\w)")),
    ("asterisk emphasis", re.compile(r"(?<![\w*'])\*[A-Za-z][^*\n]*[A-Za-z.)]\*(?![\w*'])")),
    ("a bullet made of an asterisk", re.compile(r"^\s*\* ")),
    ("a reST role or directive", re.compile(r":(?:class|func|data|meth|mod|attr|ref|doc|obj|exc):|^\s*\.\. \w+::")),
    ("a Markdown heading or link", re.compile(r"^#{1,6} |\[[^\]\n]+\]\([^)\n]+\)")),
    ("a private name", re.compile(r"(?:^|[\s(,'\"=])_[A-Za-z]\w*|\w\._[A-Za-z]")),
    ("development history", re.compile(r"\b(?:issue|session|round)[- ]?#?\d+", re.IGNORECASE)),
]


def help_problems(text: str) -> list[str]:
    """One entry per line of ``text`` with markup, a private name, development history or a module
    path (``harness.<x>`` where ``x`` is no public name of the package)."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        out += [f"line {n}: {what}: {line.strip()}" for what, pattern in MARKUP if pattern.search(line)]
        for m in re.finditer(r"\bharness\.(\w+)((?:\.\w+)*)", line):
            if m.group(2) or m.group(1) not in harness.__all__:
                out.append(f"line {n}: an internal name {m.group(0)}: {line.strip()}")
    return out


def _commands() -> list[str]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(sub.choices)


def _help(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main([*argv, "--help"])
    assert exc.value.code == 0
    return capsys.readouterr().out


def test_the_checker_finds_each_kind_of_problem_and_passes_plain_text():
    bad = ["see ``--metrics``", "the metric **regressed** when", "it is *not* stored", "* a bullet",
           "(:func:`x`)", "## Heading", "[docs](docs/running.md)", "calls _run_one", "uses store._lock",
           "the issue-6 target", "(harness.perf.kernels)", "harness.registry", "__bold__"]
    for text in bad:
        assert help_problems(text), text
    plain = ["'all', names and globs: 'seed_*', 'bug*' glob", "RUN_DIR/models/<variant>__s<seed>.pt",
             "--set model.d_model=128", "use harness.load_model or python -m harness decode",
             "From Python, harness.compare(RUN_A, RUN_B) returns", "  - a dash bullet", "N x M, 2 * 3"]
    for text in plain:
        assert help_problems(text) == [], text


def test_every_help_page_is_plain_text(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    commands = _commands()
    assert {"run", "check", "compare", "profile", "bench"} <= set(commands)
    problems = []
    for argv in ([], *([c] for c in commands)):
        text = _help(capsys, argv)
        assert "usage: python -m harness" in text
        problems += [f"{' '.join(['python -m harness', *argv, '--help'])}: {p}" for p in help_problems(text)]
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize("command", ["run", "check", "bench", "profile"])
def test_preset_help_lists_every_preset_and_names_its_default(capsys, monkeypatch, command):
    monkeypatch.setenv("COLUMNS", "1000")  # no wrapping: each preset name whole
    text = _help(capsys, [command])
    line = next(line for line in text.splitlines() if line.lstrip().startswith("--preset"))
    assert all(re.search(rf"\b{name}\b", line) for name in PRESETS), line
    default = re.search(r"Default: (\w+)", line)
    assert default, line
    if default.group(1) != DEFAULT_PRESET:  # another default only with its reason, after the one it replaces
        assert re.search(rf"Default: .*, not {DEFAULT_PRESET} as elsewhere: \w", line), line
