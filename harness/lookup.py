"""Finding a stored run: a folder, a run id under the results folder, or ``latest`` (the run that
finished last). Used by ``report``, ``compare``, ``verify`` and :func:`harness.load_run`."""
from __future__ import annotations

from pathlib import Path

from .errors import StoreError
from .store import CHECKS_DIR, RECORD_KINDS, RunStore, config_path, iter_runs


def resolve_run(ref: str, results_dir: str = "results", records: bool = False) -> RunStore:
    """A run from a folder path, a run id under ``results_dir`` or ``latest`` (:func:`latest_run`).

    Args:
        records: also accept a record folder (``check``, ``bench``, ``profile``; ``verify`` reads
            them); by default one is refused, naming its files.

    Raises:
        StoreError: nothing matches, naming where it looked; a record where a run is wanted.
    """
    if ref == "latest":
        return latest_run(results_dir)
    p, q = Path(ref), Path(results_dir) / ref
    for folder in (p, q, Path(results_dir) / CHECKS_DIR / ref):
        if config_path(folder) is not None:
            store = RunStore.open(folder)
            if records:  # verify reads the folder itself, an unreadable config.json included
                return store
            kind = store.meta().kind
            if kind in RECORD_KINDS:
                files = ", ".join(sorted(f.name for f in folder.glob("*.md"))) or "its files"
                raise StoreError(f"{str(folder)!r} is a {kind} record, not a training run: read {files} there "
                                 f"(report, compare and load_run take runs of python -m harness run)")
            return store
    where = f"{str(p)!r} is not" if p == q else f"neither {str(p)!r} nor {str(q)!r} is"  # an absolute ref: one place
    raise StoreError(f"run {ref!r} not found: {where} a run folder "
                     f"(runs live under {results_dir}/<run-id>/ with a config.json)")


def finished(root: Path) -> tuple[bool, str]:
    """Whether the folder ``root`` holds a finished run, and if not, why (for ``latest``): a run of
    ``python -m harness run`` or a measurement experiment (not a record, :data:`RECORD_KINDS`) whose
    ``config.json`` says ``status: complete``. A folder written before runs recorded their status
    counts when its report was written and every planned trial is stored."""
    try:
        store = RunStore.open(root)
        meta = store.meta()
    except StoreError as exc:
        return False, str(exc)
    if meta.kind in RECORD_KINDS:
        return False, f"a {meta.kind} record"
    if meta.status is not None:
        return meta.status == "complete", f"status {meta.status!r}"
    planned = set(meta.planned_keys())
    if not (root / "report.md").is_file() or not planned <= store.done_keys():
        return False, "unfinished (no status recorded, trials or report missing)"
    return True, ""


def latest_run(results_dir: str = "results") -> RunStore:
    """The latest *finished* run under ``results_dir`` (:func:`finished`): the one whose
    ``config.json`` was written last (a run rewrites it when it ends), ties broken by name.
    Check records (in ``checks/``), benches, profiles and runs that are still running, were
    interrupted or were killed are passed over (name them to open one).

    Raises:
        StoreError: no finished run, naming the newest folder passed over and why.
    """
    folders = sorted(iter_runs(results_dir), key=lambda d: (config_path(d).stat().st_mtime, d.name),
                     reverse=True)
    skipped = []
    for folder in folders:
        ok, why = finished(folder)
        if ok:
            return RunStore.open(folder)
        skipped.append((folder, why))
    if not skipped:
        raise StoreError(f"no runs under {results_dir!r} (run one with: python -m harness run)")
    folder, why = skipped[0]
    raise StoreError(f"no finished run under {results_dir!r}; the newest folder, {str(folder)!r} ({why}), is not "
                     f"one (name it to open it anyway, or finish it with: python -m harness run --resume {folder})")
