"""The on-disk layout of a run and atomic writes.

``results/<run-id>/``::

    config.json    resolved config, variants, seeds, environment, command, config hash, status ...:
                   read and written as the typed :class:`harness.runmeta.RunMeta` (:meth:`RunStore.meta`)
    trials/<key>.json   one file per finished trial: {"row": {...}, "curve": [...],
                   "checksum": "sha256:..."} (``TrialResult.to_dict()``; read back as a
                   :class:`harness.trial.TrialResult`), written atomically (temp file + fsync + rename)
                   the moment the trial ends; ``trials/<key>.json.gz`` is read (and verified,
                   resumed, retired) the same way, for committed runs with long curves
    trials/quarantine/  trial files that could not be read (corrupt or foreign), moved
                   aside with a ``<name>.reason`` file each; never deleted by the harness
    trials.csv     one row per trial (rendered from trials/)
    curves.csv     loss per step (train) and per dev evaluation (dev; heldout before the dev split), all trials
    report.md      the rendered report

Because every trial is its own atomically renamed file, a run killed at any moment (even
SIGKILL) loses no finished trial and never leaves a half-written row; ``run --resume``
compares ``config.json``'s trial list with ``trials/`` and runs only what is missing.
While a process writes a run it holds an exclusive ``flock`` on ``results/<run-id>/.lock``
(released by the kernel even on SIGKILL), so two processes never write the same run.

Integrity: every trial file carries the SHA-256 of its content (``checksum``) and is checked
when it is read (:func:`read_trial_file`): it must be a JSON object with a ``row`` object naming
``variant`` (str), ``seed`` (int) and ``status`` (str), a ``curve`` list, a file name equal to
the row's trial key, and a checksum that matches (files written before checksums existed have
none and are checked by schema only). A file that fails is moved to ``trials/quarantine/`` with a
:class:`harness.errors.HarnessWarning`, so the trial counts as missing: ``run --resume`` runs it
again and the report names the file. ``python -m harness verify RUN`` checks a whole run.

Names: a run id is a folder name under ``--results-dir``, never a path (:func:`check_name`).
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import gzip
import hashlib
import json
import os
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from .settings import hash_view
from .errors import HarnessWarning, StoreError
from .runmeta import RunMeta
from .trial import (GZ_SUFFIX, CorruptTrialError, TrialResult, canonical_json, key_of_file, read_trial_file,
                    trial_checksum)


#: ``check`` writes its records to ``<results-dir>/checks/<run-id>/``, apart from the runs, so that
#: ``ls results`` and ``report latest`` see runs only.
CHECKS_DIR = "checks"
#: ``config.json`` kinds of folders that hold a record, not trials: ``report`` and ``compare``
#: refuse them, ``latest`` never names one.
RECORD_KINDS = ("check", "bench", "profile")

_UMASK = os.umask(0o022)
os.umask(_UMASK)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temp file in the same folder, fsync, rename)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file in the same folder, fsync, rename): a reader,
    or a run interrupted mid-write, sees the old file or the new one, never half of one.

    Raises:
        OSError: the write failed (a full disk, no permission); the temp file is removed and the
            error names ``path`` (a failed write or fsync names no file of its own).
    """
    path = Path(path)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp makes 0600; results are meant to be shared
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if isinstance(exc, OSError) and exc.errno and exc.filename in (None, tmp):
            raise type(exc)(exc.errno, exc.strerror, str(path)) from exc
        raise


#: Characters of a run id or experiment name (the trial-key alphabet); the first is a letter or digit.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.=+-]*")
NAME_MAX = 100


def check_name(value: Any, what: str = "run id", error: type[Exception] = StoreError) -> str:
    """Return ``value`` when it is a valid run id / experiment name, else raise ``error``.

    A name becomes a folder or file name, so it must not be able to point anywhere else: 1 to
    :data:`NAME_MAX` characters from ``A-Z a-z 0-9 _ . = + -``, starting with a letter or a
    digit (so never ``.``, ``..``, a hidden name or an option-like ``-x``), no ``..`` anywhere
    and no path separator.

    Raises:
        error (StoreError by default): one line saying what is wrong and what is allowed.
    """
    allowed = f"{'an' if what[:1] in 'aeiou' else 'a'} {what} is a name, not a path: 1-{NAME_MAX} of A-Z a-z 0-9 _ . = + -, starting with a letter or digit"
    if not isinstance(value, str) or not value:
        raise error(f"{what} must not be empty ({allowed})")
    if "/" in value or "\\" in value or os.sep in value:
        why = "contains a path separator"
    elif ".." in value:
        why = "contains '..'"
    elif len(value) > NAME_MAX:
        why = f"has {len(value)} characters"
    elif not NAME_RE.fullmatch(value):
        bad = next((c for c in value if not re.fullmatch(r"[A-Za-z0-9_.=+-]", c)), value[:1])
        why = f"contains {bad!r}" if not re.fullmatch(r"[A-Za-z0-9_.=+-]", bad) else f"starts with {bad!r}"
    else:
        return value
    raise error(f"{what} {value!r} {why} ({allowed})")


def config_hash(payload: Any) -> str:
    """Short stable hash of a JSON-able payload (the resolved config of a run). A run config
    (``{"model": ..., "train": ...}``) is hashed with renamed keys under their old names
    (:func:`harness.settings.hash_view`), so a rename keeps stored runs resumable."""
    if isinstance(payload, dict) and payload and set(payload) <= {"model", "train", "task"}:
        payload = hash_view(payload)
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:12]


class RunStore:
    """One run's folder. Create with :meth:`create`, reopen with :meth:`open`."""

    def __init__(self, root: Path):
        self.root = Path(root)
        #: the main table of the last report rendered through this object (set by
        #: :func:`harness.report.write_report`), so the command line prints it without aggregating again
        self.summary: "Any | None" = None

    @property
    def trials_dir(self) -> Path:
        return self.root / "trials"

    @classmethod
    def create(cls, results_dir: str | Path, meta: "dict | RunMeta", run_id: str | None = None,
               prefix: str = "") -> "RunStore":
        """Make ``results_dir/<run-id>/`` and write ``config.json`` (``meta``: a :class:`RunMeta`,
        whose ``run_id`` is set to the folder's name, or its dict, to which ``run_id`` is added).

        An explicit ``run_id`` must be a valid name (:func:`check_name`) and must not exist yet;
        without one the folder is named ``prefix`` + the time, with ``-2``, ``-3`` ... appended
        when that name is taken. The folder is made with one ``mkdir`` (atomic), so of two processes
        creating the same run id exactly one succeeds.

        Raises:
            StoreError: an invalid run id; the run id exists (being written by another process,
                or a finished or killed run); the results directory cannot be created or written.
        """
        results_dir = Path(results_dir)
        explicit = run_id is not None
        if explicit:
            check_name(run_id)
        run_id = run_id or prefix + _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        made = None
        try:
            if results_dir.exists() and not results_dir.is_dir():
                raise NotADirectoryError(20, "Not a directory")
            results_dir.mkdir(parents=True, exist_ok=True)
            n = 1
            while True:
                root = results_dir / (run_id if n == 1 else f"{run_id}-{n}")
                try:
                    root.mkdir()
                    break
                except FileExistsError:
                    if explicit:
                        raise StoreError(_taken(root)) from None
                    n += 1
            made = root
            (root / "trials").mkdir()
            store = cls(root)
            if isinstance(meta, RunMeta):
                meta.run_id = root.name
                meta = meta.to_dict()
            atomic_write_text(root / "config.json", json.dumps({**meta, "run_id": root.name}, indent=2, default=str))
        except OSError as exc:
            if made is not None:  # nothing half-made stays behind (a full disk, a quota)
                shutil.rmtree(made, ignore_errors=True)
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
        if config_path(root) is None:
            raise StoreError(f"{str(path)!r} is not a run directory (no config.json); "
                             f"runs live under results/<run-id>/")
        return cls(root)

    def meta(self) -> RunMeta:
        """The run's ``config.json`` as a :class:`RunMeta`. Raises StoreError when it cannot be
        read or parsed, or holds no JSON object."""
        path = config_path(self.root) or self.root / "config.json"
        try:
            meta = json.loads(read_config_text(path))
        except (OSError, EOFError) as exc:
            raise StoreError(f"cannot read {str(path)!r}: {getattr(exc, 'strerror', None) or exc} "
                             f"(check the path and its permissions)") from exc
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise StoreError(f"{str(path)!r} is not valid JSON ({exc}); "
                             f"it was not written by the harness or was edited by hand") from exc
        if not isinstance(meta, dict):
            raise StoreError(f"{str(path)!r} holds a {type(meta).__name__}, not a run's config object")
        return RunMeta.from_dict(meta)

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

    def is_locked(self) -> bool:
        """True while another process holds the run's lock (is writing it)."""
        return _lock_held(self.root)

    def write_meta(self, meta: "dict | RunMeta") -> None:
        """Rewrite ``config.json`` atomically with ``meta`` (a :class:`RunMeta` or its dict); the
        store is the only writer of run metadata."""
        if isinstance(meta, RunMeta):
            meta = meta.to_dict()
        atomic_write_text(self.root / "config.json", json.dumps(meta, indent=2, default=str))
        with contextlib.suppress(FileNotFoundError):  # a gzip'd reference's config, now superseded
            (self.root / "config.json.gz").unlink()

    @property
    def quarantine_dir(self) -> Path:
        return self.trials_dir / "quarantine"

    def write_trial(self, key: str, result: TrialResult) -> Path:
        """Store one finished trial atomically as ``trials/<key>.json``: ``result.to_dict()`` with
        its checksum; returns its path."""
        path = self.trials_dir / f"{key}.json"
        payload = json.loads(canonical_json(result.to_dict()))  # plain JSON types (tensors -> numbers)
        payload.pop("checksum", None)
        payload.pop("key", None)
        payload["checksum"] = trial_checksum(payload)
        atomic_write_text(path, json.dumps(payload))
        return path

    @property
    def retried_dir(self) -> Path:
        return self.trials_dir / "retried"

    def retire(self, key: str) -> Path:
        """Move the stored trial ``key`` to ``trials/retried/`` (``<key>.json``, then ``<key>.2.json``,
        ...), so it counts as missing and ``run --resume --retry-failed`` runs it again; the old file
        is kept for the record. Returns its new path."""
        src = self.trial_path(key)
        self.retried_dir.mkdir(exist_ok=True)
        dest, n = self.retried_dir / src.name, 1
        while dest.exists():
            n += 1
            dest = self.retried_dir / f"{key}.{n}{src.name[len(key):]}"
        os.replace(src, dest)
        self.__dict__.get("_trial_cache", {}).pop(src.name, None)
        return dest

    def trial_files(self) -> list[Path]:
        """``trials/*.json`` and ``trials/*.json.gz`` (:data:`harness.trial.GZ_SUFFIX`), sorted by
        name (the quarantine folder is not included)."""
        return sorted(p for pattern in ("*.json", f"*{GZ_SUFFIX}") for p in self.trials_dir.glob(pattern)
                      if p.is_file())

    def trial_path(self, key: str) -> Path:
        """The stored file of trial ``key``: ``trials/<key>.json``, or ``<key>.json.gz`` where only
        that exists."""
        plain = self.trials_dir / f"{key}.json"
        packed = self.trials_dir / f"{key}{GZ_SUFFIX}"
        return packed if packed.is_file() and not plain.is_file() else plain

    def read_trial(self, path: Path, quarantine: bool = True) -> TrialResult | None:
        """One stored trial, checked by :func:`read_trial_file` (so its key, ``result.key``, is the
        file's name).

        A file that fails the check is moved to ``trials/quarantine/`` (when ``quarantine``)
        with a one-line :class:`HarnessWarning`, and ``None`` is returned.
        """
        try:
            result = read_trial_file(path)
        except CorruptTrialError as exc:
            if quarantine:
                self._quarantine(Path(path), exc.reason)
            return None
        return TrialResult.from_dict(result)

    def _quarantine(self, path: Path, reason: str) -> None:
        dest = self.quarantine_dir / path.name
        try:
            self.quarantine_dir.mkdir(exist_ok=True)
            n = 1
            while dest.exists():
                n += 1
                dest = self.quarantine_dir / f"{path.stem}.{n}{path.suffix}"
            os.replace(path, dest)
            stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            atomic_write_text(dest.with_name(dest.name + ".reason"),
                              json.dumps({"file": path.name, "reason": reason, "moved_at": stamp}) + "\n")
        except OSError as exc:
            warnings.warn(f"{path}: {reason}; it could not be moved to {self.quarantine_dir} "
                          f"({exc.strerror or exc}) and is skipped", HarnessWarning, stacklevel=3)
            return
        warnings.warn(f"{path}: {reason}; moved to {dest} (the trial counts as missing: "
                      f"python -m harness run --resume {self.root} runs it again)", HarnessWarning, stacklevel=3)

    def quarantined(self) -> list[dict[str, str]]:
        """Every file in ``trials/quarantine/``, sorted by name: ``{"file": its name there,
        "original": its name in trials/, "reason": why it was moved}``."""
        if not self.quarantine_dir.is_dir():
            return []
        out = []
        for p in sorted(self.quarantine_dir.iterdir()):
            if p.suffix == ".reason" or not p.is_file():
                continue
            try:
                note = json.loads(p.with_name(p.name + ".reason").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                note = {}
            note = note if isinstance(note, dict) else {}
            out.append({"file": p.name, "original": str(note.get("file") or p.name),
                        "reason": str(note.get("reason") or "no reason recorded")})
        return out

    def done_keys(self) -> set[str]:
        """Keys of the valid trials stored so far (finished trials, whatever their status);
        invalid files are quarantined (see :meth:`read_trial`)."""
        return {key_of_file(p) for p in self.trial_files() if self.read_trial(p) is not None}

    def missing(self, keys: Iterable[str]) -> list[str]:
        """``keys`` that have no valid stored trial yet, in the given order."""
        done = self.done_keys()
        return [k for k in keys if k not in done]

    def load_trials(self, quarantine: bool = True) -> list[TrialResult]:
        """Every valid stored trial (a :class:`harness.trial.TrialResult`), sorted by key. A corrupt or foreign file is moved to
        ``trials/quarantine/`` with a warning (see :meth:`read_trial`) and left out."""
        out = []
        for p in self.trial_files():
            result = self._cached_trial(p, quarantine)
            if result is not None:
                out.append(result)
        return out

    def _cached_trial(self, path: Path, quarantine: bool) -> TrialResult | None:
        """:meth:`read_trial`, once per file version: a file read by this store and unchanged since
        (same inode, size and mtime; trial files are replaced atomically, never edited) is not read
        again, so writing the tables, the report and the terminal table of a run reads each trial
        file once. Callers treat the returned results as read-only."""
        cache = self.__dict__.setdefault("_trial_cache", {})
        try:
            st = Path(path).stat()
        except OSError:
            return self.read_trial(path, quarantine=quarantine)
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        hit = cache.get(Path(path).name)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        result = self.read_trial(path, quarantine=quarantine)
        if result is not None:
            cache[Path(path).name] = (stamp, result)
        return result

    def write_tables(self, trials: list[TrialResult] | None = None) -> tuple[Path, Path]:
        """Render ``trials.csv`` and ``curves.csv`` from the stored trials (atomically); pass
        ``trials`` (as :meth:`load_trials` returns them, e.g. :attr:`Run.trials`) when they are
        read already."""
        trials_text, curves_text = tables_text(self.load_trials() if trials is None else trials)
        trials_csv, curves_csv = self.root / "trials.csv", self.root / "curves.csv"
        atomic_write_text(trials_csv, trials_text)
        atomic_write_text(curves_csv, curves_text)
        return trials_csv, curves_csv


@dataclass
class Run:
    """One stored run read once (:func:`load_run`): ``meta`` (``config.json``, a :class:`RunMeta`)
    and ``trials``, every valid trial sorted by key as
    :meth:`RunStore.load_trials` returns them (:class:`harness.trial.TrialResult` s)."""

    store: RunStore
    meta: RunMeta
    trials: list[TrialResult]

    @property
    def root(self) -> Path:
        return self.store.root


def load_run(run_dir: str | Path, quarantine: bool = True) -> Run:
    """Open the run at ``run_dir`` and read its ``config.json`` and every trial file once (a
    corrupt or foreign one is quarantined with a warning and left out, see
    :meth:`RunStore.read_trial`).

    Raises:
        StoreError: no run at ``run_dir``, or an unreadable ``config.json``.
    """
    store = RunStore.open(run_dir)
    return Run(store, store.meta(), store.load_trials(quarantine=quarantine))


def tables_text(trials: list[TrialResult]) -> tuple[str, str]:
    """The text of ``trials.csv`` and ``curves.csv`` for ``trials`` (as :meth:`RunStore.load_trials`
    returns them): one row per trial without its traceback; one row per curve point."""
    import pandas as pd

    rows = [{k: v for k, v in t.row.items() if k != "traceback"} for t in trials]
    curves = [{"variant": t.row["variant"], "seed": t.row["seed"], "point": t.row.get("point", ""),
               **c} for t in trials for c in t.curve if isinstance(c, dict)]
    return pd.DataFrame(rows).to_csv(index=False), pd.DataFrame(curves).to_csv(index=False)


def _lock_held(root: Path) -> bool:
    """True when a live process holds ``root/.lock`` (probed without creating the file)."""
    try:
        import fcntl

        fd = os.open(root / ".lock", os.O_RDWR)
    except (ImportError, OSError):
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing the probe's descriptor releases a lock it took
    return False


def _taken(root: Path) -> str:
    """Why a run folder that already exists cannot be created again."""
    if _lock_held(root):
        return (f"run {str(root)!r} is being written by another process (run id {root.name!r} is taken); "
                f"choose another --run-id, or wait for that run to finish")
    return (f"run id {root.name!r} already exists in {str(root.parent)!r}; choose another --run-id, "
            f"or continue that run with: python -m harness run --resume {root}")


def config_path(folder: str | Path) -> Path | None:
    """A run folder's ``config.json``, or its ``config.json.gz`` where only that is stored (a reference thinned for
    size: results/reference/README.md); None when neither is a file."""
    return next((p for p in (Path(folder) / n for n in ("config.json", "config.json.gz")) if p.is_file()), None)


def read_config_text(path: Path) -> str:
    """The text of a ``config.json`` or ``config.json.gz``. Raises OSError, EOFError or UnicodeDecodeError."""
    return (gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()).decode("utf-8")


def iter_runs(results_dir: str | Path) -> Iterable[Path]:
    """Run folders under ``results_dir``, newest first."""
    p = Path(results_dir)
    if not p.is_dir():
        return []
    return sorted((d for d in p.iterdir() if config_path(d) is not None), key=lambda d: d.name, reverse=True)
