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
    assert len(list((tmp_path / "results").iterdir())) == 1  # one run, no stray folders
