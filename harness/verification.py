"""Is a stored run complete and intact? :func:`verify_store` (a :class:`VerifyOutcome`; ``python -m
harness verify`` prints it, :func:`harness.verify` returns it) and :func:`verify_run`, read-only.

Nothing is moved or rewritten (``report`` and ``run --resume`` quarantine corrupt trial files;
verify only names them). Each defect is one line, its path relative to the run folder.
"""
from __future__ import annotations

import gzip
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .runmeta import RunMeta

from .store import RunStore, config_path, read_config_text, tables_text
from .trial import GZ_SUFFIX, CorruptTrialError, TrialResult, current_header, key_of_file, read_trial_file

#: Trial-file key of a saved model's record (``run --save-models``): ``{"file": "models/<key>.pt",
#: "sha256", "bytes"}`` (:mod:`harness.saved` writes it, :func:`model_problems` checks it).
MODEL_KEY = "model"
#: The folder of a run that holds the saved weights.
MODELS_DIR = "models"


@dataclass
class VerifyOutcome:
    """A stored run verified (:func:`verify_store`).

    Attributes:
        store: the run (or record) folder. problems: one line per defect, its path relative to the
        folder. notes: one line per remark that is not a defect (legacy files, quarantined files,
        how to resume an interrupted run). trial_files: the trial files found.
    """

    store: RunStore
    problems: list[str]
    notes: list[str]
    trial_files: int

    @property
    def ok(self) -> bool:
        """No problem was found."""
        return not self.problems

    @property
    def exit_code(self) -> int:
        """0 the run is intact, 1 a problem was found (``python -m harness verify``)."""
        return 0 if self.ok else 1

    def summary(self) -> str:
        """One line: how many problems in how many trial files, or ok."""
        if self.problems:
            return f"verify {self.store.root}: {len(self.problems)} problem(s) in {self.trial_files} trial file(s)"
        return f"verify {self.store.root}: ok ({self.trial_files} trial file(s))"


def verify_store(store: RunStore) -> VerifyOutcome:
    """Check ``store`` read-only (:func:`verify_run`). A damaged run never raises: every defect
    is a problem line."""
    problems, notes = verify_run(store)
    return VerifyOutcome(store, problems, notes, len(store.trial_files()))


def verify_run(store: RunStore) -> tuple[list[str], list[str]]:
    """Check ``store`` (read-only). Returns ``(problems, notes)``, one line each, paths
    relative to the run folder. A damaged run never raises: every defect is a problem line."""
    problems: list[str] = []
    notes: list[str] = []
    meta = _read_meta(store, problems)
    planned = meta.planned_keys() if meta is not None and meta.trials is not None else None
    is_run = planned is not None
    if is_run and planned and not store.trials_dir.is_dir():
        problems.append("trials/: missing")
    valid, corrupt = _read_trials(store, problems, notes)
    _check_tables(store, valid, is_run, problems, notes)
    problems += model_problems(store.root, valid)  # run --save-models: models/<key>.pt against its SHA-256
    # planned trials (config.json of 'python -m harness run') against stored ones
    if not is_run:
        if meta is not None:
            notes.append("config.json lists no planned trials (not written by 'python -m harness run'); "
                         "the planned-trials check is skipped")
        return problems, notes
    _check_planned(store, meta, planned, {t.key for t in valid}, corrupt, problems, notes)
    _check_code(store, meta, problems, notes)
    return problems, notes


def _read_meta(store: RunStore, problems: list[str]) -> RunMeta | None:
    """``config.json`` as a :class:`RunMeta`, or None (with a problem line) when it holds no JSON object."""
    raw: object
    try:
        raw = json.loads(read_config_text(config_path(store.root) or store.root / "config.json"))
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        problems.append(f"config.json: cannot be read as JSON ({str(exc)[:120]})")
        raw = None
    if raw is not None and not isinstance(raw, dict):
        problems.append(f"config.json: holds a JSON {type(raw).__name__}, not a run's config object")
        raw = None
    return RunMeta.from_dict(raw) if isinstance(raw, dict) else None


def _read_trials(store: RunStore, problems: list[str], notes: list[str]) -> tuple[list[TrialResult], set[str]]:
    """``(valid trial results, keys of corrupt files)``; corrupt files are problem
    lines, legacy (checksum-less) files, quarantined files and other files in trials/ notes."""
    root = store.root
    valid: list[TrialResult] = []
    corrupt: set[str] = set()
    legacy: list[str] = []
    for path in store.trial_files():
        try:
            result = read_trial_file(path)
        except CorruptTrialError as exc:
            problems.append(f"{path.relative_to(root)}: {exc.reason}")
            corrupt.add(key_of_file(path))
            continue
        if "checksum" not in result:
            legacy.append(str(path.relative_to(root)))
        valid.append(TrialResult.from_dict(result))  # its key is the file's name (read_trial_file checks it)
    if legacy:
        notes.append(f"{len(legacy)} trial file(s) written before checksums existed ({', '.join(legacy[:2])}"
                     f"{' ...' if len(legacy) > 2 else ''}): checked by schema only")
    for q in store.quarantined():
        notes.append(f"trials/quarantine/{q['file']}: trials/{q['original']} was moved aside earlier "
                     f"({q['reason']})")
    if store.trials_dir.is_dir():
        leftovers = sorted(p.name for p in store.trials_dir.iterdir() if p.is_file() and p.suffix != ".json"
                           and not p.name.endswith(GZ_SUFFIX))
        if leftovers:
            notes.append(f"trials/: {len(leftovers)} other file(s) ({', '.join(leftovers[:3])}"
                         f"{' ...' if len(leftovers) > 3 else ''}), e.g. temporary files of a killed write; "
                         f"harmless, never read")
    return valid, corrupt


def _check_tables(store: RunStore, valid: list[TrialResult], is_run: bool, problems: list[str],
                  notes: list[str]) -> None:
    """trials.csv / curves.csv must be what the valid trial files render to. A committed reference
    may keep a table gzipped (``curves.csv.gz``: the same text, a fifth of the bytes); it is read
    in place of a missing plain file. An absent ``curves.csv`` is a note, not a defect: nothing but
    this check reads it, and it is rendered from the trial files, so the committed references leave
    the big ones out."""
    root = store.root
    want_trials, want_curves = tables_text(valid)
    for name, want in (("trials.csv", want_trials), ("curves.csv", want_curves)):
        path = root / name
        packed = root / f"{name}.gz"
        if not path.is_file() and packed.is_file():
            path, name = packed, f"{name}.gz"
        elif not path.is_file():
            if valid and is_run and name == "curves.csv":  # derived from the trial files alone
                notes.append(f"{name}: absent; the trial files hold every curve (python -m harness report {root} "
                             f"renders it)")
            elif valid and is_run:  # other commands (profile) store trials without tables
                problems.append(f"{name}: missing (render it with: python -m harness report {root})")
            continue
        try:
            have = gzip.decompress(path.read_bytes()).decode("utf-8") if path.suffix == ".gz" \
                else path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile) as exc:
            problems.append(f"{name}: cannot be read ({exc})")
            continue
        have = current_header(have) if name.startswith("trials.csv") else have  # old column spellings
        if have != want:
            problems.append(f"{name}: does not match the trial files ({_table_difference(have, want)}; "
                            f"re-render with: python -m harness report {root})")


def _check_planned(store: RunStore, meta: RunMeta, keys: list[str], stored: set[str], corrupt: set[str],
                   problems: list[str], notes: list[str]) -> None:
    """Planned trial ``keys`` against the ``stored`` ones: extra files are problems; missing ones
    are problems of a finished run and a note (how to resume) of an interrupted one."""
    root = store.root
    missing = [k for k in keys if k not in stored and k not in corrupt]  # a corrupt file is named above
    for k in sorted(stored - set(keys)):
        problems.append(f"trials/{k}.json: not a trial planned in config.json")
    status = meta.status
    if not missing:
        return
    if status in ("interrupted", "running", "out_of_time", "stopped"):
        how = ("was interrupted" if status == "interrupted" else "spent its --time-budget" if status == "out_of_time"
               else "was stopped (a file could not be written)" if status == "stopped" else
               "is being written by another process" if store.is_locked() else "was killed")
        notes.append(f"the run {how}: {len(keys) - len(missing)} of {len(keys)} planned trial(s) stored; "
                     f"finish it with: python -m harness run --resume {root}")
        return
    for k in missing:
        problems.append(f"trials/{k}.json: missing (planned in config.json"
                        f"{'; the run finished' if status == 'complete' else ''}; run it again with: "
                        f"python -m harness run --resume {root})")


def _check_code(store: RunStore, meta: RunMeta, problems: list[str], notes: list[str]) -> None:
    """The run's ``code`` records (:mod:`harness.provenance`): a plugin copy missing or not matching
    its recorded SHA-256 is a problem (the run folder changed); this checkout's code differing from
    the code that trained the latest trials, a resume that went on with other code, or no record
    at all are notes (the run is intact; ``load_model`` warns per trial)."""
    from .plugins import PluginSpec
    from .provenance import code_changes, current_code, latest_code, sha256

    records = [meta.code] + [r.code for r in meta.resumes or []]
    for p in [p for code in records if isinstance(code, dict) for p in code.get("plugins") or []]:
        copy = p.get("copy") if isinstance(p, dict) else None
        if not isinstance(copy, str) or not copy.startswith("plugins/") or ".." in copy:
            continue
        path = store.root / copy
        try:
            data = path.read_bytes()
        except OSError:
            problems.append(f"{copy}: missing or unreadable (config.json records it as the source of plugin "
                            f"{p.get('path')})")
            continue
        if sha256(data) != p.get("sha256"):
            problems.append(f"{copy}: checksum mismatch (not the plugin source config.json records)")
    latest = latest_code(meta)
    if latest is None:
        notes.append("config.json records no code (a run made before the code was recorded): the code that "
                     "trained it is unknown")
        return
    changed = [i for i, r in enumerate(meta.resumes or [], 1) if r.code_changes]
    if changed:
        notes.append(f"resumed with other code at resume(s) {changed} (--allow-code-change): its trials were "
                     f"trained by {len(changed) + 1} versions of the code")
    now = code_changes(latest, current_code(PluginSpec.from_dict(meta.plugins)).record)
    if now:
        notes.append(f"this checkout's code differs from the code that trained the run: {'; '.join(now)}")


def _table_difference(have: str, want: str) -> str:
    """A few words on the first difference between two CSV texts."""
    a, b = have.splitlines(), want.splitlines()
    if not a or not b or a[0] != b[0]:
        return "different columns"
    if len(a) != len(b):
        return f"{len(a) - 1} row(s), the trial files give {len(b) - 1}"
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"row {i} differs"
    return "different line endings"

def model_problems(root: Path, trials: Sequence[TrialResult]) -> list[str]:
    """``harness verify``'s check of the saved weights: one ``'PATH: what is wrong'`` line per
    recorded file (:data:`MODEL_KEY` in a stored trial's ``extra``) that is missing or whose SHA-256
    differs."""
    problems = []
    for t in trials:
        rec = t.extra.get(MODEL_KEY)
        if rec is None:
            continue
        if not isinstance(rec, dict) or not isinstance(rec.get("file"), str) or not isinstance(rec.get("sha256"), str):
            problems.append(f"trials/{t.key}.json: its 'model' record is not {{file, sha256, bytes}}")
            continue
        if rec["file"] != f"{MODELS_DIR}/{t.key}.pt":  # never a path outside the run's models/
            problems.append(f"trials/{t.key}.json: its model file is {rec['file']!r}, not {MODELS_DIR}/{t.key}.pt")
            continue
        path = Path(root) / rec["file"]
        if not path.is_file():
            problems.append(f"{rec['file']}: missing (trials/{t.key}.json records it)")
        elif hashlib.sha256(path.read_bytes()).hexdigest() != rec["sha256"]:
            problems.append(f"{rec['file']}: checksum mismatch (the file changed after the run stored it)")
    return problems
