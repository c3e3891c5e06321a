"""The unit of work an executor hands a worker: :class:`WorkUnit`, one trial or the trials of one vectorised trial
group; :func:`run_unit`, what a worker process runs for either; :func:`plan_units`, a plan's trials as units."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from ..trial import TrialResult, TrialSpec

OnDone = Callable[[TrialSpec, TrialResult], None]


@dataclass
class WorkUnit:
    """One unit of work: ``specs`` (one trial, or the K trials of one vectorised trial group,
    :func:`harness.group.group_specs`) and, for a group, ``capture`` (``run --capture``; None: a single trial)."""

    specs: list[TrialSpec]
    capture: str | None = None

    @property
    def grouped(self) -> bool:
        """True for a vectorised trial group (its worker reports when it began)."""
        return self.capture is not None

    @property
    def key(self) -> str:
        """The first trial's key (a unit's name in logs and process titles)."""
        return self.specs[0].key

    def payload(self) -> tuple[list[dict[str, Any]], str | None]:
        """What crosses the process boundary: the specs' plain dicts and ``capture`` (:func:`run_unit`'s arguments)."""
        return [ts.to_dict() for ts in self.specs], self.capture

    def results(self, out: dict[str, Any] | None, failure: str | None = None,
                log: Callable[[str], None] | None = None) -> list[TrialResult]:
        """The unit's results in its order from :func:`run_unit`'s ``out``; each trial ``failed`` with ``failure``
        when the worker raised or died; a group's log lines (a fallback to sequential trials) go to ``log``."""
        if failure is not None:
            return [TrialResult.failed(ts, failure) for ts in self.specs]
        for line in out["log"] if log else ():
            log(line)
        return [TrialResult.from_dict(d) for d in out["results"]]


def plan_units(specs: list[TrialSpec], vectorise: bool = False, capture: str = "auto") -> list[WorkUnit]:
    """``specs`` as units: one trial each, or with ``vectorise`` one per trial group (at most
    :data:`harness.runmeta.MAX_GROUP` seeds; :func:`harness.group.group_specs`) with ``capture``."""
    if not vectorise:
        return [WorkUnit([ts]) for ts in specs]
    from ..group import group_specs
    from ..runmeta import MAX_GROUP

    return [WorkUnit(group, capture) for group in group_specs(list(specs), MAX_GROUP)]


def run_unit(specs: list[dict[str, Any]], progress: list, capture: str | None) -> dict[str, Any]:
    """A worker's side of a :class:`WorkUnit` (``WorkUnit.payload()``; ``progress``: one ``progress(step, loss)``
    callback or None per trial): a single trial (:func:`harness.train.run_trial`) or a vectorised trial group
    (:func:`harness.group.pool_group`). Returns ``{"results": [TrialResult.to_dict(), ...], "log": [lines],
    "started": time.time() when the unit began}``, the same shape for both."""
    if capture is not None:
        from ..group import pool_group

        return pool_group(specs, progress, capture)
    from ..train import run_trial

    started = time.time()
    return {"results": [run_trial(TrialSpec.from_dict(specs[0]), progress=progress[0]).to_dict()], "log": [],
            "started": started}
