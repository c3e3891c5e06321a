"""Per-trial progress bars: a trial's bar says when its final evaluation runs (a g2p trial decodes
thousands of words after its last step), in this process and from pool workers."""
from __future__ import annotations

import io
import sys

from harness.executors import pool as executors
from harness.config import get_preset
from harness.progress import TrialBars
from harness.trial import TrialSpec


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_bar_says_final_evaluation_at_the_last_step(monkeypatch):
    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    cfg = get_preset("tiny").override({"train.steps": 10}).to_dict()
    spec = TrialSpec("baseline", 0, cfg)
    bars = TrialBars(enabled=True)
    bars.update(spec, 5, 1.25)
    bars.update(spec, 9, 1.0)
    assert "final evaluation" not in term.getvalue()
    bars.update(spec, 10, 0.75)
    assert "loss=0.750, final evaluation" in term.getvalue()
    bars.close_all()


def test_a_worker_always_reports_its_last_step(monkeypatch):
    """Progress from a pool worker is throttled (one message per PROGRESS_EVERY_S), but the last
    step always goes out, so the parent's bar reaches the end and says the final evaluation runs."""
    sent = []

    class Queue:
        def put_nowait(self, item):
            sent.append(item)

    monkeypatch.setattr(executors, "_WORKER_PROGRESS", Queue())
    monkeypatch.setattr(executors, "PROGRESS_EVERY_S", 3600.0)
    progress = executors.QueueProgress("baseline__s0", steps=10)
    for step in range(1, 11):
        progress(step, 1.0 / step)
    assert [s for _, s, _ in sent] == [1, 10]  # the first (throttle window opens), then the last
