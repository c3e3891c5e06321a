"""The on-disk layout of a run and atomic writes.

``results/<run-id>/``::

    config.json    resolved config, variants, seeds, environment, command, config hash
    trials/<key>.json   one file per finished trial: {"row": {...}, "curve": [...]}
                   written atomically (temp file + fsync + rename) the moment the trial ends
    trials.csv     one row per trial (rendered from trials/)
    curves.csv     loss per step (train) and per evaluation (heldout), all trials
    report.md      the rendered report

Because every trial is its own atomically renamed file, a run killed at any moment (even
SIGKILL) loses no finished trial and never leaves a half-written row; ``run --resume``
compares ``config.json``'s trial list with ``trials/`` and runs only what is missing.
While a process writes a run it holds an exclusive ``flock`` on ``results/<run-id>/.lock``
(released by the kernel even on SIGKILL), so two processes never write the same run.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Iterable

from .errors import StoreError


_UMASK = os.umask(0o022)
os.umask(_UMASK)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temp file in the same folder, fsync, rename)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; results are meant to be shared
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def config_hash(payload: Any) -> str:
    """Short stable hash of a JSON-able payload (the resolved config of a run)."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:12]


def trial_key(variant: str, seed: int, point: str = "") -> str:
    """File-system-safe key of one trial: ``<variant>[__<sweep point>]__s<seed>``."""
    raw = f"{variant}__{point}__s{seed}" if point else f"{variant}__s{seed}"
    return re.sub(r"[^A-Za-z0-9_.=+-]", "_", raw)


class RunStore:
    """One run's folder. Create with :meth:`create`, reopen with :meth:`open`."""

    def __init__(self, root: Path):
        self.root = Path(root)

    @property
    def trials_dir(self) -> Path:
        return self.root / "trials"

    @classmethod
    def create(cls, results_dir: str | Path, meta: dict, run_id: str | None = None) -> "RunStore":
        """Make ``results_dir/<run-id>/`` and write ``config.json``.

        Raises:
            StoreError: the results directory cannot be created or written.
        """
        results_dir = Path(results_dir)
        run_id = run_id or _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        root = results_dir / run_id
        n = 1
        while root.exists():
            n += 1
            root = results_dir / f"{run_id}-{n}"
        try:
            (root / "trials").mkdir(parents=True)
            store = cls(root)
            atomic_write_text(root / "config.json", json.dumps({**meta, "run_id": root.name}, indent=2, default=str))
        except OSError as exc:
            raise StoreError(f"cannot write results directory {str(results_dir)!r}: {exc.strerror or exc} "
                             f"(choose another with --results-dir)") from exc
        return store

    @classmethod
    def open(cls, path: str | Path) -> "RunStore":
        """Reopen an existing run. Raises StoreError when it is missing or not a run."""
        root = Path(path)
        if not root.exists():
            raise StoreError(f"no run at {str(path)!r} (runs live under results/<run-id>/; "
                             f"see: ls results)")
        if not (root / "config.json").is_file():
            raise StoreError(f"{str(path)!r} is not a run directory (no config.json); "
                             f"runs live under results/<run-id>/")
        return cls(root)

    def meta(self) -> dict:
        """The run's ``config.json``. Raises StoreError when it cannot be read or parsed."""
        path = self.root / "config.json"
        try:
            meta = json.loads(path.read_text())
        except OSError as exc:
            raise StoreError(f"cannot read {str(path)!r}: {exc.strerror or exc} "
                             f"(check the path and its permissions)") from exc
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise StoreError(f"{str(path)!r} is not valid JSON ({exc}); "
                             f"it was not written by the harness or was edited by hand") from exc
        if not isinstance(meta, dict):
            raise StoreError(f"{str(path)!r} holds a {type(meta).__name__}, not a run's config object")
        return meta

    @contextlib.contextmanager
    def lock(self):
        """Hold an exclusive, non-blocking ``flock`` on ``<run>/.lock`` while writing the run.

        Raises:
            StoreError: another live process holds the lock (a killed process releases it).
        """
        try:
            import fcntl
        except ImportError:  # not POSIX: no locking
            yield
            return
        try:
            fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreError(f"cannot write to run directory {str(self.root)!r}: {exc.strerror or exc} "
                             f"(check its permissions)") from exc
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                raise StoreError(f"run {str(self.root)!r} is being written by another process; "
                                 f"wait for it to finish or stop it first") from exc
            yield
        finally:
            os.close(fd)

    def write_meta(self, meta: dict) -> None:
        atomic_write_text(self.root / "config.json", json.dumps(meta, indent=2, default=str))

    def write_trial(self, key: str, result: dict) -> Path:
        """Store one finished trial atomically; returns its path."""
        path = self.trials_dir / f"{key}.json"
        atomic_write_text(path, json.dumps(result, default=_json_default))
        return path

    def done_keys(self) -> set[str]:
        """Keys of the trials stored so far (finished trials, whatever their status)."""
        return {p.stem for p in self.trials_dir.glob("*.json")}

    def missing(self, keys: Iterable[str]) -> list[str]:
        """``keys`` that have no stored trial yet, in the given order."""
        done = self.done_keys()
        return [k for k in keys if k not in done]

    def load_trials(self) -> list[dict]:
        """Every stored trial, sorted by key. Unreadable files are skipped (cannot happen
        with atomic writes, but a hand-edited folder should not crash a report)."""
        out = []
        for p in sorted(self.trials_dir.glob("*.json")):
            try:
                result = json.loads(p.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            result["key"] = p.stem
            out.append(result)
        return out

    def write_tables(self) -> tuple[Path, Path]:
        """Render ``trials.csv`` and ``curves.csv`` from the stored trials (atomically)."""
        import pandas as pd

        trials = self.load_trials()
        rows = [{k: v for k, v in t["row"].items() if k != "traceback"} for t in trials]
        curves = [{"variant": t["row"]["variant"], "seed": t["row"]["seed"], "point": t["row"].get("point", ""),
                   **c} for t in trials for c in t.get("curve", [])]
        trials_csv, curves_csv = self.root / "trials.csv", self.root / "curves.csv"
        atomic_write_text(trials_csv, pd.DataFrame(rows).to_csv(index=False))
        atomic_write_text(curves_csv, pd.DataFrame(curves).to_csv(index=False))
        return trials_csv, curves_csv


def _json_default(o):
    if hasattr(o, "item"):
        return o.item()
    return str(o)


def iter_runs(results_dir: str | Path) -> Iterable[Path]:
    """Run folders under ``results_dir``, newest first."""
    p = Path(results_dir)
    if not p.is_dir():
        return []
    return sorted((d for d in p.iterdir() if (d / "config.json").is_file()), key=lambda d: d.name, reverse=True)
