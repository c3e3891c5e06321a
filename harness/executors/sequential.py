"""One trial after the other in this process (``--jobs 1``)."""
from __future__ import annotations

from typing import Iterable

from ..progress import TrialBars
from ..trial import TrialSpec
from .units import OnDone


def run_sequential(specs: Iterable[TrialSpec], on_done: OnDone, bars: TrialBars | None = None) -> None:
    """Run ``specs`` one after the other in this process (``--jobs 1``)."""
    from ..train import run_trial

    bars = bars or TrialBars(False)
    for ts in specs:
        def progress(step, loss, ts=ts):
            bars.update(ts, step, loss)

        try:
            result = run_trial(ts, progress=progress if bars.enabled else None)
        finally:
            bars.close(ts.key)
        on_done(ts, result)
