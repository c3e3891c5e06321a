"""Live tracking of a trial as it trains: TensorBoard events (``run --tensorboard [DIR]``) and MLflow
runs (``run --mlflow [URI]``), written by the process that trains the trial.

The training loop (:class:`harness.train.TrainingLoop`, so a vectorised group's seeds too, one loop each)
hands every curve row it makes to its :class:`TrialTracking` (:meth:`TrialTracking.point`: a
training row every ``train.log_every`` steps, a dev row at every evaluation and the final one);
the row becomes the scalars :func:`harness.tboard.curve_scalars` names (``train/loss``,
``train/grad_norm``, ``train/learning_rate``, ``dev/ce``, ``dev/exact_match``, ...), stamped
with the wall time of the moment it was logged (``time.time()``, seconds since the epoch), and every
:class:`Tracker` logs them at once. When the trial's row is complete (:func:`harness.train.run_trial`,
a group's ``train_all``) :meth:`TrialTracking.finish` writes its final metrics and hparams.

A :class:`Tracker` has three calls: ``start(spec)``, ``log(step, scalars, walltime)`` and
``end(result)``. Two implementations:

* :class:`TensorBoardTracker`: ``torch.utils.tensorboard.SummaryWriter`` into ``<logdir>/<trial key>/``,
  flushed after every log (about 0.2 ms per scalar in the training process), so ``tensorboard
  --logdir`` shows a running trial; ``end`` writes the hparams and ``final/*`` scalars as
  :func:`harness.tboard.write_trial` does, then the marker :data:`harness.tboard.LIVE_MARK`, which
  tells the export (``report --tensorboard``, and the run's own end-of-trial write) to leave the
  trial's events as they are.
* :class:`MLflowTracker`: one MLflow run per trial (named by its key) in the experiment named after the
  harness run's id, through ``mlflow.tracking.MlflowClient``: params = the trial's config keys
  (``model.d_model``, ``train.steps``, ...) and slots, tags ``variant``, ``seed``, ``point``,
  ``trial``, ``harness_run``; metrics per step with the same tags as TensorBoard; the final ones and
  the status at the end (``FINISHED``, or ``FAILED`` for a trial that is not ``ok``).

A spec carries its tracking as ``TrialSpec.track`` (``{"tensorboard": logdir | None, "mlflow": uri |
None, "run": run id}``, set by :func:`with_tracking` for the trials a run executes, never stored in
``config.json``). A tracker that raises (a full disk, an unreachable MLflow server) is dropped with one
:class:`harness.errors.HarnessWarning`; the trial goes on.
"""
from __future__ import annotations

import dataclasses
import os
import time
import warnings
from pathlib import Path
from typing import Any

from .errors import ConfigError, HarnessWarning
from .tboard import LIVE_MARK, curve_scalars, final_scalars, learning_rate, trial_hparams, write_end
from .trial import TrialResult, TrialSpec

#: ``pip`` words that install the MLflow client (the ``mlflow`` extra).
MLFLOW_INSTALL = "pip install -e '.[mlflow]' (or pip install mlflow-skinny)"


def check_mlflow() -> None:
    """Raises ConfigError (one line naming the install) when the ``mlflow`` package is not importable.
    Finds the package without importing it (an import takes seconds)."""
    import importlib.util

    if importlib.util.find_spec("mlflow") is None:
        raise ConfigError(f"--mlflow needs the mlflow package: {MLFLOW_INSTALL}")


def default_mlflow_uri(run_root: Path) -> str:
    """Where ``--mlflow`` without a URI logs: a local file store, ``file:<run folder>/mlruns``
    (``mlflow ui --backend-store-uri file:<run folder>/mlruns`` shows it)."""
    return "file:" + str(Path(run_root).resolve() / "mlruns")


def with_tracking(specs: list[TrialSpec], track: dict[str, Any] | None) -> list[TrialSpec]:
    """Copies of ``specs`` that track themselves live (``track``: ``{"tensorboard", "mlflow", "run"}``),
    or ``specs`` unchanged when ``track`` is None or names no tracker."""
    if not track or not (track.get("tensorboard") or track.get("mlflow")):
        return specs
    return [dataclasses.replace(ts, track=dict(track)) for ts in specs]


class Tracker:
    """One trial's live record somewhere; the base class records nothing."""

    def start(self, spec: TrialSpec) -> None:
        """The trial ``spec`` begins (before its first step)."""

    def log(self, step: int, scalars: dict[str, float], walltime: float) -> None:
        """``scalars`` (tag -> value) at training ``step``, logged at ``walltime`` (s since the epoch)."""

    def end(self, result: TrialResult) -> None:
        """The trial ended with ``result`` (its complete row: final metrics, status); release everything."""


class TensorBoardTracker(Tracker):
    """TensorBoard events of one trial as it trains, under ``<logdir>/<trial key>/`` (module docstring)."""

    def __init__(self, logdir: str | Path):
        self.logdir = Path(logdir)
        self.writer = None
        self.tags: set[str] = set()

    def start(self, spec: TrialSpec) -> None:
        """Replaces event files an earlier attempt of the trial left (an interrupted run, a retry)."""
        from torch.utils.tensorboard import SummaryWriter

        self.folder, self.config = self.logdir / spec.key, spec.config
        self.folder.mkdir(parents=True, exist_ok=True)
        for old in [*self.folder.glob("events.out.tfevents.*"), self.folder / LIVE_MARK]:
            old.unlink(missing_ok=True)
        self.writer = SummaryWriter(log_dir=str(self.folder))

    def log(self, step: int, scalars: dict[str, float], walltime: float) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step, walltime=walltime)
        self.tags.update(scalars)
        self.writer.flush()

    def end(self, result: TrialResult) -> None:
        write_end(self.writer, result, self.config, self.tags)
        self.writer.close()
        (self.folder / LIVE_MARK).write_text(f"{result.status}\n")


class MLflowTracker(Tracker):
    """One MLflow run per trial in the experiment named after the harness run (module docstring)."""

    def __init__(self, uri: str, run: str):
        self.uri, self.run = uri, run

    def start(self, spec: TrialSpec) -> None:
        """A local file store is allowed (MLflow 3 refuses one unless ``MLFLOW_ALLOW_FILE_STORE`` is set)."""
        if self.uri.startswith("file:") or "://" not in self.uri:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=self.uri)
        found = self.client.get_experiment_by_name(self.run)
        try:
            experiment = found.experiment_id if found else self.client.create_experiment(self.run)
        except MlflowException:  # another worker created it first
            experiment = self.client.get_experiment_by_name(self.run).experiment_id
        tags = {"variant": spec.variant, "seed": str(spec.seed), "point": spec.point, "trial": spec.key,
                "harness_run": self.run}
        self.run_id = self.client.create_run(experiment, tags=tags, run_name=spec.key).info.run_id
        params = trial_hparams({"variant": spec.variant, "seed": spec.seed, "point": spec.point,
                                **{f"slot_{k}": v for k, v in spec.slots.items()}}, spec.config)
        self._batch(params={k: v for k, v in params.items() if k != "status"})

    def _batch(self, metrics: dict[str, float] | None = None, step: int = 0, walltime: float | None = None,
               params: dict[str, Any] | None = None) -> None:
        from mlflow.entities import Metric, Param

        stamp = int(1000 * (walltime if walltime is not None else time.time()))
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, stamp, step) for k, v in (metrics or {}).items()],
                              params=[Param(k, str(v)) for k, v in (params or {}).items()])

    def log(self, step: int, scalars: dict[str, float], walltime: float) -> None:
        self._batch(scalars, step, walltime)

    def end(self, result: TrialResult) -> None:
        self._batch(final_scalars(result), int(result.row.get("steps") or 0))
        self.client.set_tag(self.run_id, "status", result.status)
        self.client.set_terminated(self.run_id, "FINISHED" if result.status == "ok" else "FAILED")


class TrialTracking:
    """What a training loop holds: the trial's trackers (none when its spec has no ``track``).

    ``point(row)`` logs one curve row; ``finish(result)`` ends every tracker once. A tracker that
    raises is dropped with one :class:`HarnessWarning` naming it and the trial."""

    def __init__(self, spec: TrialSpec | None = None, trackers: list[Tracker] | None = None):
        self.spec, self.trackers = spec, list(trackers or [])
        self.lr = learning_rate(spec.config) if spec is not None and self.trackers else None
        for t in list(self.trackers):
            self._call(t, "start", spec)

    def _call(self, tracker: Tracker, what: str, *args) -> None:
        try:
            getattr(tracker, what)(*args)
        except Exception as exc:  # noqa: BLE001 - live curves are not worth the trial
            self.trackers.remove(tracker)
            warnings.warn(f"{type(tracker).__name__} of trial {self.spec.key} stopped at {what}: "
                          f"{type(exc).__name__}: {exc}", HarnessWarning, stacklevel=2)

    def point(self, row: dict[str, Any]) -> None:
        """Log one curve row (``{"step", "split", ...}``) with the wall time of now."""
        if not self.trackers:
            return
        scalars, walltime = curve_scalars(row, self.lr), time.time()
        for t in list(self.trackers):
            self._call(t, "log", int(row.get("step", 0)), scalars, walltime)

    def finish(self, result: TrialResult) -> None:
        """End every tracker with the trial's complete ``result``; later calls do nothing."""
        for t in list(self.trackers):
            self._call(t, "end", result)
        self.trackers = []


def trial_tracking(spec: TrialSpec) -> TrialTracking:
    """The :class:`TrialTracking` of ``spec.track`` (empty for a spec without one)."""
    track = spec.track or {}
    trackers: list[Tracker] = []
    if track.get("tensorboard"):
        trackers.append(TensorBoardTracker(track["tensorboard"]))
    if track.get("mlflow"):
        trackers.append(MLflowTracker(track["mlflow"], str(track.get("run") or "harness")))
    return TrialTracking(spec, trackers)


__all__ = ["Tracker", "TensorBoardTracker", "MLflowTracker", "TrialTracking", "trial_tracking", "with_tracking",
           "check_mlflow", "default_mlflow_uri"]
