"""TensorBoard event files of a run's trials: ``run --tensorboard [DIR]``, ``report RUN
--tensorboard [DIR]`` and ``harness.run(..., tensorboard=DIR)``.

Each trial becomes one TensorBoard run, ``<logdir>/<trial key>`` (``tensorboard --logdir
<logdir>`` overlays the variants and seeds), written with ``torch.utils.tensorboard.SummaryWriter``.
During ``run --tensorboard`` the process that trains a trial writes its events as it trains, with the
wall time of each log (:mod:`harness.track`; not with ``--executor ray``); a trial without a complete
live record (a Ray trial, a worker that died, ``report --tensorboard`` of a run made without it) is
written here from its stored record (its curve and its row), all at once, by the process that stores
or exports it. Both give the same tags and values (:func:`curve_scalars`, :func:`write_end`). What each
trial holds:

* scalars, x = the training step: ``train/loss`` and ``train/grad_norm`` (the label-smoothed
  training loss and the gradient norm before clipping, as the curve stores them: per step, or
  ``log_every``-step means), ``train/learning_rate`` (the schedule's rate at
  each logged step: :func:`harness.schedule.lr_at`, computed from the trial's config, since the
  curve does not store it), ``dev/ce`` (nats/token), ``dev/exact_match``
  and, where the task scores them, ``dev/wer`` and ``dev/per`` (the dev set's periodic evaluations;
  ``heldout/...`` in a run stored before the dev split); any other number a curve point carries (a
  plugin task's metric, a gradient norm) as ``train/<name>`` or ``dev/<name>``;
* hparams (the HParams tab): the variant, seed, sweep point, task, each slot's component and the
  config's scalar fields (``model.d_model``, ``train.steps``, ...), with the final test metrics of the
  row (``final/heldout_ce``, ``final/exact_match``, ``final/wer``, ``final/per``, ..., a plugin task's
  own metric: :func:`final_names`);
* a text note ``notes`` naming what the trial's record does not hold (the gradient norm, in a
  trial stored before the curve's training rows held ``grad_norm``).

Requires the ``tensorboard`` package (``pip install -e '.[tensorboard]'``).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

from .errors import ConfigError
from .metrics import BUILTIN, EVAL_SPLITS
from .trial import TrialResult

#: Curve keys that are not metrics.
NOT_METRICS = {"step", "split", "wall_s", "variant", "seed", "point"}
#: Row columns written as the trial's final metrics (where present and finite): the built-in tasks' metrics
#: shown in ``tensorboard`` (:attr:`harness.metrics.Metric.show`), then ``train_s``; a task's own: :func:`final_names`.
FINAL = tuple(m.name for m in BUILTIN.values() if "tensorboard" in m.show) + ("train_s",)
#: Quantities a reader looks for; a trial whose record lacks one says so in its ``notes`` text.
#: The file :mod:`harness.track` leaves in a trial's event folder when its live record is complete (the
#: trial's end written): an export leaves such a folder as it is (:func:`written_live`).
LIVE_MARK = "live-complete"
EXPECTED = {"train/grad_norm": "gradient norm: the trial was stored before its curve rows held "
                                "\"grad_norm\" (runs made before that change)"}


def _writer_class():
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:  # torch raises ImportError naming tensorboard when it is missing
        raise ConfigError("--tensorboard needs the tensorboard package: python -m pip install tensorboard "
                          "(or pip install -e '.[tensorboard]')") from exc
    return SummaryWriter


def check_available() -> None:
    """Raises ConfigError (one line, how to install it) when ``tensorboard`` is not installed."""
    _writer_class()


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def trial_hparams(row: dict, config: dict) -> dict[str, Any]:
    """The trial's identity (variant, seed, point, status, ``slot_*``) and its config's scalar fields
    (``model.<field>``, ``train.<field>``; TensorBoard takes str, bool, int, float, so others as str)."""
    out: dict[str, Any] = {"variant": row.get("variant", ""), "seed": int(row.get("seed", 0)),
                           "point": str(row.get("point") or ""), "status": str(row.get("status", ""))}
    out.update({k: str(v) for k, v in row.items() if k.startswith("slot_")})
    for section in ("model", "train", "task"):
        for k, v in (config.get(section) or {}).items():
            out[f"{section}.{k}"] = v if isinstance(v, (bool, int, float, str)) else str(v)
    return out


def learning_rate(config: dict) -> Callable[[int], float] | None:
    """lr at (1-based) training step t: the rate LambdaLR set before that step, or None (an
    unreadable config)."""
    from .config import RunConfig
    from .schedule import lr_at

    try:
        cfg = RunConfig.from_dict(config)
    except Exception:  # noqa: BLE001 - an old or foreign config: no learning-rate curve
        return None
    return lr_at(cfg.train, cfg.model.d_model)


def curve_scalars(point: dict, lr: Callable[[int], float] | None) -> dict[str, float]:
    """The TensorBoard (and MLflow) scalars of one curve row: ``<split>/<name>`` for each finite
    number (``dev/ce`` for a dev row's ``loss``; ``heldout/...`` for a run stored before the dev split),
    and for a training row ``train/learning_rate`` = ``lr(step)`` (:func:`learning_rate`; None: left out)."""
    split = point.get("split") if point.get("split") in EVAL_SPLITS else "train"
    out: dict[str, float] = {}
    for name, value in point.items():
        v = _number(value)
        if name not in NOT_METRICS and v is not None:
            out[f"{split}/{'ce' if split != 'train' and name == 'loss' else name}"] = v
    if split == "train" and lr is not None:
        out["train/learning_rate"] = lr(int(point.get("step", 0)))
    return out


def final_names(result: TrialResult) -> tuple[str, ...]:
    """The row columns written as ``final/<name>``: :data:`FINAL`, then the task's own metrics (a plugin
    task's), found as the numbers of the trial's last dev curve row that its row holds too
    (:func:`harness.metrics.row_values` puts them in both; the row's are the test set's)."""
    row = result.row
    held = [p for p in result.curve if p.get("split") in EVAL_SPLITS]
    own = [k for k in (held[-1] if held else {}) if k in row and k not in NOT_METRICS and k not in FINAL
           and _number(row[k]) is not None]
    return FINAL + tuple(own)


def final_scalars(result: TrialResult) -> dict[str, float]:
    """``{"final/<name>": value}`` of the trial's row for :func:`final_names`, where finite."""
    final = {f"final/{k}": _number(result.row.get(k)) for k in final_names(result)}
    return {k: v for k, v in final.items() if v is not None}


def write_end(w, result: TrialResult, config: dict, tags: set[str]) -> None:
    """The end of a trial's events on the ``SummaryWriter`` ``w``: hparams with the final metrics,
    the ``final/*`` scalars at the trial's last step, and the ``notes`` text naming what ``tags``
    (the scalar tags written) lack of :data:`EXPECTED`."""
    from torch.utils.tensorboard.summary import hparams

    row, final = result.row, final_scalars(result)
    for summary in hparams(trial_hparams(row, config), final):
        w.file_writer.add_summary(summary)
    for k, v in final.items():
        w.add_scalar(k, v, int(row.get("steps") or 0))
    absent = [text for tag, text in EXPECTED.items() if tag not in tags]
    if absent:
        w.add_text("notes", "Not in this trial's record: " + "; ".join(absent))


def write_trial(logdir: str | Path, key: str, result: TrialResult, config: dict) -> Path:
    """Write one stored trial (its ``row`` and ``curve``) as the TensorBoard run ``logdir/key``,
    replacing event files an earlier export left there (and a live record's :data:`LIVE_MARK`).
    ``config``: the trial's ``RunConfig.to_dict()``. Returns the run's folder.

    Raises:
        ConfigError: tensorboard is not installed.
    """
    writer_class = _writer_class()
    folder = Path(logdir) / key
    for old in [*folder.glob("events.out.tfevents.*"), folder / LIVE_MARK]:
        old.unlink(missing_ok=True)
    lr = learning_rate(config)
    tags: set[str] = set()
    with writer_class(log_dir=str(folder)) as w:
        for point in result.curve:
            scalars = curve_scalars(point, lr)
            for tag, v in scalars.items():
                w.add_scalar(tag, v, int(point.get("step", 0)))
            tags.update(scalars)
        write_end(w, result, config, tags)
    return folder


def written_live(logdir: str | Path, key: str) -> bool:
    """Whether ``logdir/key`` holds a complete live record (:mod:`harness.track`: events written as the
    trial trained, ended by its :data:`LIVE_MARK`), which an export leaves as it is."""
    return (Path(logdir) / key / LIVE_MARK).is_file()


def trial_writer(logdir: str | Path, meta) -> Callable[[str, TrialResult], None]:
    """``after_store(key, result)`` for :func:`harness.runner.execute`: each stored trial written
    with its planned spec's config (``meta``: the run's :class:`harness.runmeta.RunMeta`), unless its
    events were written live and completed by the process that trained it (:func:`written_live`). A
    trial whose worker died or was stopped gets its events from its stored record, or, when that holds
    no curve and live events are there, its end added to them (:func:`end_partial`)."""
    check_available()
    configs = {t.key: t.config for t in meta.trials or []}

    def write(key: str, result: TrialResult) -> None:
        config = configs.get(key) or meta.config
        if written_live(logdir, key):
            return
        if not result.curve and any((Path(logdir) / key).glob("events.out.tfevents.*")):
            end_partial(logdir, key, result, config)  # the curve its worker wrote before it stopped stays
        else:
            write_trial(logdir, key, result, config)

    return write


def end_partial(logdir: str | Path, key: str, result: TrialResult, config: dict) -> Path:
    """End the live record of a trial whose worker stopped before the trial's end (its stored record
    holds no curve: the worker died, was ended): the events it wrote stay, the trial's end (hparams
    with its status, :func:`write_end`) is added beside them and the record marked complete."""
    folder = Path(logdir) / key
    with _writer_class()(log_dir=str(folder)) as w:
        write_end(w, result, config, set(EXPECTED))  # what the lost curve held is unknown: no note
    (folder / LIVE_MARK).write_text(f"{result.status}\n")
    return folder


def export_run(store, option: str | None = None) -> tuple[Path, int, int]:
    """Write every stored trial of ``store`` (:class:`harness.store.RunStore`) to TensorBoard,
    under :func:`run_logdir` of ``option`` (``report --tensorboard [DIR]``), except those whose live
    record there is complete (:func:`written_live`: their events keep the wall times of training and
    are not written twice). Returns ``(the run's event folder, trials in it, of which kept as written
    live)``.

    Raises:
        ConfigError: tensorboard is not installed.
    """
    folder = run_logdir(option, store.root)
    write = trial_writer(folder, store.meta())
    trials = store.load_trials()
    live = sum(written_live(folder, t.key) for t in trials)
    for t in trials:
        write(t.key, t)
    return folder, len(trials), live


def default_logdir(run_root: Path) -> Path:
    """Where a run's events go when no folder is named: ``<run folder>/tensorboard``."""
    return Path(run_root) / "tensorboard"


def run_logdir(option: str | None, run_root: Path) -> Path:
    """``--tensorboard`` given without a folder (``""``): :func:`default_logdir`; with a folder
    ``DIR``: ``DIR/<run id>``, so several runs share one ``tensorboard --logdir DIR``."""
    return default_logdir(run_root) if not option else Path(option) / Path(run_root).name
