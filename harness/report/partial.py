"""The banner of a partial run: what a report or a terminal summary says first when the run it
shows has fewer trials than it planned (interrupted, killed or still running).

A run that is resumed to completion gets no banner: the banner is derived each time from the
stored trials and ``config.json``'s planned keys and status, never stored in the report itself.
"""
from __future__ import annotations

from ..runmeta import RunMeta
from ..store import RunStore

#: ``config.json`` status -> how the banner names it.
STATUS_WORDS = {"interrupted": "interrupted", "running": "still running, or killed before it could record an end",
                "out_of_time": "its --time-budget was spent", "stopped": "stopped: a file of the run could not be written"}


def partial_counts(store: RunStore, meta: RunMeta | None = None) -> tuple[int, int] | None:
    """``(done, planned)`` trials of a partial run, or None for a complete one (every planned trial
    stored and the status not ``interrupted``) and for a run that records no plan (bench, check)."""
    meta = meta if meta is not None else store.meta()
    planned = meta.planned_keys()
    if not planned:
        return None
    done = len({t.key for t in store.load_trials()} & set(planned))  # cached: no second read of a file
    if done >= len(planned) and meta.status != "interrupted":
        return None
    return done, len(planned)


def partial_banner(store: RunStore, meta: RunMeta | None = None, markdown: bool = True) -> list[str]:
    """Lines that open a partial run's report (``markdown``: a block quote and a blank line) or
    terminal summary; ``[]`` for a complete run.

    Example: ``PARTIAL RUN: 2 of 11 planned trials done (interrupted); every table and verdict
    covers only those. Resume: python -m harness run --resume results/r``.
    """
    meta = meta if meta is not None else store.meta()
    counts = partial_counts(store, meta)
    if counts is None:
        return []
    done, planned = counts
    how = STATUS_WORDS.get(meta.status or "", meta.status or "status not recorded")
    resume = f"python -m harness run --resume {store.root}"
    if markdown:
        return [f"> **Partial run: {done} of {planned} planned trials done** ({how}); every table, plot "
                f"and verdict below covers only those. Resume: `{resume}`", ""]
    return [f"PARTIAL RUN: {done} of {planned} planned trials done ({how}); the table covers only those. "
            f"Resume: {resume}"]
