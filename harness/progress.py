"""Progress bars of a run on stderr: one over the trials, one per running trial.

Shared by :mod:`harness.runner` (the run's bar) and :mod:`harness.executors` (the per-trial bars
fed from worker processes); neither imports the other for them. Bars are silent with
``--quiet`` or when stderr is not a terminal. Module code never prints: the bars write to
stderr through tqdm only while a command runs.
"""
from __future__ import annotations

import sys
from typing import Any


def progress_bar(total: int, desc: str, quiet: bool, leave: bool = True, position: int = 0):
    """A tqdm bar, silent when ``quiet`` or when stderr is not a terminal."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, leave=leave, position=position, dynamic_ncols=True,
                disable=quiet or not sys.stderr.isatty(), file=sys.stderr)


class TrialBars:
    """One tqdm bar per running trial (steps, with the latest loss), below the run's bar.

    Args:
        enabled: False makes every method a no-op (``--quiet`` or stderr not a terminal).
    """

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._bars: dict[str, Any] = {}
        self._free: list[int] = []

    def update(self, ts, step: int, loss: float) -> None:
        """Move the bar of planned trial ``ts`` (a :class:`harness.trial.TrialSpec`) to ``step``; at
        its last step the bar says that the trial's final evaluation is running."""
        if not self.enabled:
            return
        bar = self._bars.get(ts.key)
        if bar is None:
            position = self._free.pop(0) if self._free else len(self._bars) + 1
            bar = progress_bar(ts.config["train"]["steps"], f"{ts.variant} s{ts.seed}",
                               quiet=False, leave=False, position=position)
            bar.harness_position = position
            self._bars[ts.key] = bar
        bar.update(step - bar.n)
        if bar.total and step >= bar.total:  # the last step: the final evaluation (decoding, on g2p) runs now
            bar.set_postfix_str(f"loss={loss:.3f}, final evaluation", refresh=True)
        else:
            bar.set_postfix(loss=f"{loss:.3f}", refresh=False)

    def close(self, key: str) -> None:
        bar = self._bars.pop(key, None)
        if bar is not None:
            self._free.append(bar.harness_position)
            self._free.sort()
            bar.close()

    def close_all(self) -> None:
        for key in list(self._bars):
            self.close(key)


__all__ = ["progress_bar", "TrialBars"]
