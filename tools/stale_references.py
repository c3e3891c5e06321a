"""Which committed reference runs are older than the code they describe, in a way that can change
their numbers.

Each run folder under ``results/reference/`` records the commit it ran at in ``config.json``
(``environment.git_commit``; a ``+uncommitted`` suffix means the tree differed from that commit).
For each reference folder and recorded commit this lists the files under ``NUMERIC_PATHS`` that
``git diff --name-only <commit> HEAD`` reports as changed: the training loop, the model, the
vectorised step, the tasks, the built-in variants, the presets, the measurements and statistics
(and, for a check record, a folder holding ``checks.md``, the checks: ``CHECK_PATHS``).
A change elsewhere (docs, the checks, the command line, reports) does not move a run's scores or
timings and is not listed.

Usage, from the repository root::

    python tools/stale_references.py              # one line per (reference, commit)
    python tools/stale_references.py --files      # and the changed files under each stale one
    python tools/stale_references.py --strict     # exit 1 when any reference is stale

Without the history (a shallow clone, an archive without ``.git``, no ``git`` on the PATH) a
commit that cannot be found is reported ``unknown`` with the reason; nothing fails.
It is a script beside the package, not a ``harness`` command: it reads git history, which the
harness never needs to run, train or verify a run.
"""
from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

# Paths (files, or folders ending in "/") whose changes can move a reference's scores or timings.
NUMERIC_PATHS = (
    "harness/train.py", "harness/model.py", "harness/vstep.py", "harness/group.py",
    "harness/config.py", "harness/measure.py", "harness/stats.py", "harness/env.py",
    "harness/tasks/", "harness/perf/", "variants/",
)
# A check record (a folder with checks.md) is made by the checks: their changes can move its classes too.
CHECK_PATHS = NUMERIC_PATHS + ("harness/checks/", "harness/overview.py")


@dataclass
class Reference:
    """One reference folder at one recorded commit: ``runs`` are its run folders (relative paths)."""

    name: str
    commit: str
    uncommitted: bool = False
    runs: list[str] = field(default_factory=list)
    check_record: bool = False

    @property
    def paths(self) -> tuple[str, ...]:
        """The paths whose changes can move this reference's numbers."""
        return CHECK_PATHS if self.check_record else NUMERIC_PATHS


@dataclass
class Staleness:
    """``state`` is ``current``, ``stale`` (``changed`` lists the files) or ``unknown`` (``reason``)."""

    reference: Reference
    state: str
    changed: list[str] = field(default_factory=list)
    reason: str = ""


def recorded_commit(config: Path) -> str | None:
    """``environment.git_commit`` of a run's ``config.json`` (or ``config.json.gz``), or None where it has none or does not parse."""
    try:
        raw = config.read_bytes()
        data = json.loads(gzip.decompress(raw) if config.name.endswith(".gz") else raw)
    except (OSError, EOFError, ValueError):
        return None
    env = data.get("environment") if isinstance(data, dict) else None
    commit = env.get("git_commit") if isinstance(env, dict) else None
    return commit if isinstance(commit, str) and commit and commit != "unknown" else None


def find_references(reference_root: Path) -> list[Reference]:
    """Every (top-level folder, recorded commit) under ``reference_root``, sorted by folder name.

    A folder whose runs ran at two commits gives two entries; a ``config.json`` without a commit is
    skipped.
    """
    found: dict[tuple[str, str], Reference] = {}
    for config in sorted(p for n in ("config.json", "config.json.gz") for p in reference_root.rglob(n)):
        raw = recorded_commit(config)
        if raw is None:
            continue
        rel = config.parent.relative_to(reference_root)
        top = rel.parts[0] if rel.parts else "."
        commit = raw.removesuffix("+uncommitted")
        ref = found.setdefault((top, commit), Reference(top, commit))
        ref.uncommitted |= raw.endswith("+uncommitted")
        ref.runs.append(rel.as_posix())
        ref.check_record |= (config.parent / "checks.md").is_file()
    return [found[k] for k in sorted(found)]


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)


def staleness(repo: Path, ref: Reference, head: str = "HEAD") -> Staleness:
    """Compare ``ref.commit`` with ``head`` in ``repo`` over ``ref.paths``; never raises."""
    try:
        known = _git(repo, "cat-file", "-e", f"{ref.commit}^{{commit}}")
    except OSError as err:  # no git executable
        return Staleness(ref, "unknown", reason=f"git not available ({err.strerror})")
    if known.returncode != 0:
        return Staleness(ref, "unknown", reason=f"commit {ref.commit} not in this clone's history")
    diff = _git(repo, "diff", "--name-only", ref.commit, head, "--", *ref.paths)
    if diff.returncode != 0:
        last = diff.stderr.strip().splitlines()
        return Staleness(ref, "unknown", reason=last[-1] if last else "git diff failed")
    changed = [ln for ln in diff.stdout.splitlines() if ln]
    return Staleness(ref, "stale" if changed else "current", changed=changed)


def render(results: list[Staleness], files: bool = False) -> str:
    """One line per reference: name, commit, state and a count or reason (changed files with ``files``)."""
    lines = []
    width = max((len(r.reference.name) for r in results), default=0)
    for r in results:
        commit = r.reference.commit + ("+uncommitted" if r.reference.uncommitted else "")
        if r.state == "stale":
            what = f"stale: {len(r.changed)} file(s) that can move its numbers changed since"
        elif r.state == "unknown":
            what = f"unknown: {r.reason}"
        else:
            what = "current"
        lines.append(f"{r.reference.name:<{width}}  {commit:<20} {what}")
        if files and r.state == "stale":
            lines.extend(f"{'':<{width}}    {path}" for path in r.changed)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the table; exit 0, or 1 with ``--strict`` when a reference is stale, 2 on a bad folder."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the repository (default: .)")
    parser.add_argument("--files", action="store_true", help="list the changed files under each stale reference")
    parser.add_argument("--strict", action="store_true", help="exit 1 when any reference is stale")
    args = parser.parse_args(argv)
    reference_root = args.root / "results" / "reference"
    if not reference_root.is_dir():
        print(f"error: no results/reference folder under {args.root}", file=sys.stderr)
        return 2
    results = [staleness(args.root, ref) for ref in find_references(reference_root)]
    print(render(results, files=args.files))
    return 1 if args.strict and any(r.state == "stale" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
