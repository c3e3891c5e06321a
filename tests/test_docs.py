"""Every code block of docs/components.md runs: the plugin written from the page passes the checks
on the first try, the kit calls work, the declaration examples hold."""
from __future__ import annotations

import os
import re
import subprocess
import sys

from .conftest import ROOT

DOC = ROOT / "docs" / "components.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), flags=re.S)


def test_components_page_code_blocks_run(tmp_path, monkeypatch):
    py = _blocks("python")
    plugin = [b for b in py if b.startswith("# my_plugin.py")]
    assert len(plugin) == 1 and len(py) >= 4
    (tmp_path / "my_plugin.py").write_text(plugin[0])
    monkeypatch.chdir(tmp_path)
    for block in py:
        if block is plugin[0]:
            continue
        exec(compile(block, f"{DOC.name} block", "exec"), {"__name__": "doc_block"})
    for block in _blocks("bash"):
        for line in block.strip().splitlines():
            args = line.split()
            assert args[:3] == ["python", "-m", "harness"], line
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            proc = subprocess.run([sys.executable, *args[1:], "-q", "--results-dir", str(tmp_path / "results")],
                                  cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
            assert proc.returncode == 0, line + "\n" + proc.stdout[-2000:] + proc.stderr[-2000:]


def test_python_page_code_blocks_run(tmp_path, monkeypatch):
    """docs/python.md: every python block, in order, in one namespace, as a notebook would."""
    page = ROOT / "docs" / "python.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    assert len(blocks) >= 4
    monkeypatch.chdir(tmp_path)
    ns: dict = {"__name__": "notebook"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/python.md block {i + 1}", "exec"), ns)
    runs = sum(block.count("harness.run(") for block in blocks)
    assert len([p for p in (tmp_path / "results").iterdir() if p.name != "checks"]) == runs  # one folder per run
    assert len(list((tmp_path / "results" / "checks").iterdir())) == 1  # harness.check's record
# ---- docs/seeds.md and paths: the docs stand on the repository alone ----

_PATH = re.compile(r"(?<![\w.])(?:\.\./)+[^\s)`'\"<>\]]*")
#: paths the bad-input catalogue shows being *refused* (a run id or experiment name that is a path)
REFUSED_EXAMPLES = {"../../x", "../../escaped"}


def _doc_pages():
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_docs_mention_no_path_outside_the_repository():
    """README.md and docs/ may link ``../results/...`` from docs/ (inside the repository), never a
    path that leaves it (the study notes once lived in ``../shared/seeds/``, which users never have)."""
    outside = []
    for page in _doc_pages():
        for m in _PATH.finditer(page.read_text()):
            target = (page.parent / m.group(0)).resolve()
            if m.group(0) not in REFUSED_EXAMPLES and not target.is_relative_to(ROOT.resolve()):
                outside.append(f"{page.relative_to(ROOT)}: {m.group(0)}")
    assert outside == []


def test_path_rule_catches_the_old_seed_path(tmp_path):
    """The rule above is not vacuous: the README's old wording is caught, docs/'s ../results is not."""
    readme_old = "one preset per study note in `../shared/seeds/` (`seed_000`)"
    hits = [(ROOT / m.group(0)).resolve() for m in _PATH.finditer(readme_old)]
    assert hits and not hits[0].is_relative_to(ROOT.resolve())
    inside = [(ROOT / "docs" / m.group(0)).resolve() for m in _PATH.finditer("[x](../results/reference/)")]
    assert inside and inside[0].is_relative_to(ROOT.resolve())


def test_every_seed_preset_is_described_in_seeds_md():
    """Every ``seed_00N`` variant has its own section in docs/seeds.md and a table row whose slot
    changes are exactly the variant's, so the page cannot drift from variants/presets.py."""
    from harness.registry import Registry

    reg = Registry.from_plugins()
    text = (ROOT / "docs" / "seeds.md").read_text()
    seeds = sorted(n for n in reg.variants if re.fullmatch(r"seed_\d{3}", n))
    assert seeds == [f"seed_00{i}" for i in range(5)]
    defaults = reg.variants["baseline"].slots
    for name in seeds:
        assert re.search(rf"^## Note {name[-3:]}: ", text, flags=re.M), f"no section for note {name[-3:]}"
        row = [line for line in text.splitlines() if line.startswith(f"| `{name}` |")]
        assert len(row) == 1, name
        documented = dict(pair.split("=") for pair in re.findall(r"`(\w+=\w+)`", row[0].split("|")[3]))
        changed = {s: c for s, c in reg.variants[name].slots.items() if c != defaults[s]}
        assert documented == changed, (name, documented, changed)
    for bug in (n for n in reg.variants if n.startswith("bug_")):
        assert f"`{bug}`" in text, f"{bug} is not described in docs/seeds.md"


# ---- README's layout block matches the tree ----

def _readme_layout() -> tuple[dict[str, str], list[str]]:
    """README's "## Layout" block: {top-level folder: its text} and the harness/ entry's file and folder names."""
    section = (ROOT / "README.md").read_text().split("## Layout", 1)[1]
    (block,) = re.findall(r"```\n(.*?)```", section, flags=re.S)[:1]
    entries: dict[str, str] = {}
    for line in block.splitlines():
        head = re.match(r"([\w.-]+)/\s", line)
        if head:
            current = head.group(1)
            entries[current] = line[head.end():]
        elif line.strip():
            entries[current] += " " + line.strip()
    harness_names = re.findall(r"(?<![\w./])([a-z_]+(?:\.py|/))(?![\w.])", entries.get("harness", ""))
    return entries, harness_names


def _tracked_top_level_folders() -> set[str]:
    """Top-level folders holding a tracked file (git ls-files), or, without git, every non-hidden folder."""
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True).stdout
        return {p.split("/", 1)[0] for p in out.splitlines() if "/" in p and not p.startswith(".")}
    except (OSError, subprocess.CalledProcessError):
        return {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))
                and not p.name.endswith(".egg-info")}


def test_readme_layout_names_every_top_level_folder_and_only_what_exists():
    entries, harness_names = _readme_layout()
    assert "harness" in entries and len(harness_names) >= 10, "the layout block was not parsed"
    missing = [f"{name}/" for name in entries if not (ROOT / name).is_dir()]
    missing += [f"harness/{name}" for name in harness_names if not (ROOT / "harness" / name.rstrip("/")).exists()]
    assert missing == [], f"README's layout names what the tree does not hold: {missing}"
    unnamed = sorted(_tracked_top_level_folders() - set(entries))
    assert unnamed == [], f"top-level folders README's layout does not name: {unnamed}"


def test_readme_is_short_and_the_docs_speak_of_the_project_not_its_history():
    """README.md stays an entry page (<= 250 lines; the rest is in docs/), and no README, doc, reference README,
    module or test numbers the development rounds that made it: the project speaks of itself by dates, commits
    and machines. (The pattern spells the word with a character class so that this file does not match it.)"""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250
    pattern = re.compile(r"s[e]ssion [0-9]|next GPU s[e]ssion", re.I)
    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "results" / "reference").rglob("*.md"),
             *(ROOT / "harness").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]
    found = [f"{p.relative_to(ROOT)}:{n}" for p in files
             for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if pattern.search(line)]
    assert found == [], found
