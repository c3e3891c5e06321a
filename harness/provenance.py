"""The code that made a run: what ``config.json``'s ``code`` record holds, and how it is compared.

A run records, when it starts (:func:`current_code`, written by :func:`harness.launch.run_meta`):

- ``commit``: the checkout's commit (``git rev-parse HEAD``; None outside a git checkout);
- ``dirty``: whether tracked files under ``harness/`` or ``variants/`` differ from it, and
  ``diff_sha256``: the SHA-256 of that diff (``git diff HEAD -- harness variants``; None when clean);
- ``source_sha256``: one SHA-256 over the project's own source, every ``harness/**/*.py`` and
  ``variants/**/*.py`` (relative path and content), so it holds without git too;
- ``plugins``: for every plugin file loaded (``--plugin FILE``, ``-p module`` -> its file, an
  installed entry point -> its module's file): ``name``, ``path``, ``sha256`` and ``copy``, a copy of
  its source in the run folder (``plugins/<stem>-<sha256[:12]>.py``; :func:`write_sources`). Only the
  file that registers the hooks is recorded, not modules it imports.

The project's code counts as changed when ``source_sha256`` differs; the commit and the diff only
say how (a commit that touches no code under ``harness/`` or ``variants/`` is the same code).
``run --resume`` refuses other code (:func:`harness.resume.check_code`) unless
``--allow-code-change``, which adds the new record to the resume's entry in ``resumes`` with
``code_changes`` (one line each) and ``kept`` (the trials stored before it, trained by the older
code): :func:`trial_code` tells which record trained a trial, :func:`harness.saved.load_model`
warns when this checkout differs from it, ``verify`` notes it. A run made before the record
existed has none: its code is unknown (a note, never a refusal).
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .plugins import ENTRY_POINT_GROUP, PluginSpec

#: The folders of the project whose source makes up "the project's code".
CODE_DIRS = ("harness", "variants")
#: The run folder's copy of every plugin file it loaded.
PLUGINS_DIR = "plugins"


def project_root() -> Path:
    """The folder that holds ``harness/`` and ``variants/`` (the checkout, or site-packages)."""
    return Path(__file__).resolve().parents[1]


def sha256(data: bytes) -> str:
    """The hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def source_sha256(root: Path | None = None) -> str:
    """One SHA-256 over every ``*.py`` under :data:`CODE_DIRS` of ``root`` (default: this project):
    each file's path relative to ``root`` and the SHA-256 of its bytes, in sorted path order."""
    root = Path(root or project_root())
    h = hashlib.sha256()
    for folder in CODE_DIRS:
        for path in sorted((root / folder).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            try:
                digest = hashlib.sha256(path.read_bytes()).digest()
            except OSError:
                digest = b"<unreadable>"
            h.update(path.relative_to(root).as_posix().encode("utf-8") + b"\0" + digest)
    return h.hexdigest()


def _git(root: Path, *args: str) -> bytes | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, cwd=root, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def git_state(root: Path | None = None) -> dict[str, Any]:
    """``{"commit", "dirty", "diff_sha256"}`` of the checkout at ``root`` (all None without git)."""
    root = Path(root or project_root())
    head = _git(root, "rev-parse", "HEAD")
    if not head:
        return {"commit": None, "dirty": None, "diff_sha256": None}
    diff = _git(root, "diff", "--no-color", "--no-ext-diff", "--binary", "HEAD", "--", *CODE_DIRS)
    dirty = bool(diff) if diff is not None else None
    return {"commit": head.decode().strip(), "dirty": dirty, "diff_sha256": sha256(diff) if diff else None}


def _module_file(name: str) -> str | None:
    module = sys.modules.get(name)
    path = getattr(module, "__file__", None)
    if path is None:
        try:
            found = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return None
        path = found.origin if found is not None and found.has_location else None
    return path


def plugin_paths(spec: PluginSpec) -> list[tuple[str, str]]:
    """``[(name, resolved path)]`` of the plugin files ``spec`` loads beyond the built-ins (the
    order of :mod:`harness.plugins`: entry points, ``-p`` modules, ``--plugin`` files), each path
    once; blocked names (``-p no:NAME``) and modules with no file are left out."""
    blocked = set(spec.blocked())
    named: list[tuple[str, str | None]] = []
    if not os.environ.get("HARNESS_DISABLE_PLUGIN_AUTOLOAD"):
        named += [(f"entry point {ep.name}", _module_file(ep.module))
                  for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name not in blocked]
    named += [(m, _module_file(m)) for m in spec.module_names() if m not in blocked]
    named += [(str(f), str(f)) for f in spec.files if str(f) not in blocked]
    out, seen = [], set()
    for name, path in named:
        if path is None:
            continue
        resolved = str(Path(path).resolve())
        if resolved not in seen:
            seen.add(resolved)
            out.append((name, resolved))
    return out


@dataclass
class CodeState:
    """The code as it is now: ``record`` (what ``config.json`` stores as ``code``) and ``sources``
    (``{copy path in the run folder: the plugin file's bytes}``, read once with their hashes)."""

    record: dict[str, Any]
    sources: dict[str, bytes] = field(default_factory=dict)


def current_code(spec: PluginSpec | None = None) -> CodeState:
    """The project's commit, dirty state and source hash, and every plugin file ``spec`` loads with
    its SHA-256 (a file that cannot be read is recorded with ``sha256`` None)."""
    plugins, sources = [], {}
    for name, path in plugin_paths(spec or PluginSpec()):
        try:
            data = Path(path).read_bytes()
        except OSError:
            plugins.append({"name": name, "path": path, "sha256": None, "copy": None})
            continue
        digest = sha256(data)
        copy = f"{PLUGINS_DIR}/{Path(path).stem}-{digest[:12]}.py"
        sources[copy] = data
        plugins.append({"name": name, "path": path, "sha256": digest, "copy": copy})
    record = {**git_state(), "source_sha256": source_sha256(), "plugins": plugins}
    return CodeState(record, sources)


def write_sources(root: Path, state: CodeState) -> None:
    """Copy the plugin files of ``state`` into ``root/plugins/`` (atomic; a copy already there is
    the same bytes: its name holds their hash).

    Raises:
        OSError: the run folder cannot be written.
    """
    from .store import atomic_write_bytes

    for rel, data in state.sources.items():
        path = Path(root) / rel
        if not path.is_file():
            path.parent.mkdir(exist_ok=True)
            atomic_write_bytes(path, data)


def _short(digest: Any) -> str:
    return str(digest)[:12] if digest else "none"


def _project_change(before: dict, now: dict) -> str | None:
    """One line on how the project's code differs, or None when its source is the same."""
    if before.get("source_sha256") == now.get("source_sha256"):
        return None
    if before.get("commit") and now.get("commit") and before["commit"] != now["commit"]:
        dirty = " (with uncommitted changes)" if now.get("dirty") else ""
        return f"the project's code: commit {before['commit'][:10]} -> {now['commit'][:10]}{dirty}"
    if before.get("diff_sha256") != now.get("diff_sha256"):
        return (f"the project's code: uncommitted changes under harness/ or variants/ differ (diff sha256 "
                f"{_short(before.get('diff_sha256'))} -> {_short(now.get('diff_sha256'))})")
    return (f"the project's code: its source differs (sha256 {_short(before.get('source_sha256'))} -> "
            f"{_short(now.get('source_sha256'))}; files git does not track)")


def code_changes(before: dict, now: dict) -> list[str]:
    """One line per difference between two ``code`` records: the project's code first, then each
    plugin file changed, no longer loaded or newly loaded (by path). Empty: the same code."""
    lines = [line] if (line := _project_change(before, now)) else []
    old = {p.get("path"): p for p in before.get("plugins") or [] if isinstance(p, dict)}
    new = {p.get("path"): p for p in now.get("plugins") or [] if isinstance(p, dict)}
    for path in [p for p in old if p in new] + [p for p in old if p not in new] + [p for p in new if p not in old]:
        if path not in new:
            lines.append(f"plugin file {path} is no longer loaded")
        elif path not in old:
            lines.append(f"plugin file {path} is loaded now but was not then")
        elif old[path].get("sha256") != new[path].get("sha256"):
            lines.append(f"plugin file {path} changed (sha256 {_short(old[path].get('sha256'))} -> "
                         f"{_short(new[path].get('sha256'))})")
    return lines


def latest_code(meta) -> dict | None:
    """The ``code`` record of the code that trained the run's latest trials (a :class:`RunMeta`):
    the last resume's that recorded one, else the run's own; None: not recorded (an older run)."""
    code = meta.code
    for r in meta.resumes or []:
        if r.code is not None:
            code = r.code
    return code


def trial_code(meta, key: str) -> dict | None:
    """The ``code`` record of the code that trained trial ``key`` of the run ``meta``: the last
    resume that recorded new code and had not stored ``key`` before it (``kept``), else the run's
    own record. None: not recorded."""
    code = meta.code
    for r in meta.resumes or []:
        if r.code is not None and key not in (r.kept or []):
            code = r.code
    return code


def code_note(meta) -> list[str]:
    """The report's lines on the run's code (``- code: ...``, and one per resume that went on with
    other code), for the environment block."""
    code = meta.code
    if code is None:  # a run made before the code was recorded: its report stays as it was
        return []
    dirty = "" if not code.get("dirty") else f" + uncommitted changes (diff sha256 {_short(code.get('diff_sha256'))})"
    plugins = ", ".join(f"{Path(p['path']).name} {_short(p.get('sha256'))}" for p in code.get("plugins") or [])
    lines = [f"- code: commit `{str(code.get('commit') or 'none')[:10]}`{dirty}, source sha256 "
             f"`{_short(code.get('source_sha256'))}`" + (f", plugins: `{plugins}`" if plugins else "")]
    for i, r in enumerate(meta.resumes or [], 1):
        if r.code_changes:
            lines.append(f"- code changed at resume {i} (--allow-code-change; {len(r.kept or [])} trial(s) "
                         f"stored before it were trained by the older code): {'; '.join(r.code_changes)}")
    return lines
