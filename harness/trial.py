"""The trial protocol: what a trial takes (:class:`TrialSpec`) and what it returns
(:class:`TrialResult`), as typed records that travel as plain JSON.

A *trial* is one variant x one seed x one config on one device (:func:`harness.train.run_trial`
runs it). Both records cross process boundaries (a process pool, a Ray cluster) and are stored
(a spec in the run's ``config.json`` under ``trials``, a result as ``trials/<key>.json``), so
each has ``to_dict`` / ``from_dict`` that produce and accept exactly the JSON of earlier
versions: an old run still loads, resumes and verifies (its checksums are over this JSON).
Everywhere else in the harness (runner, executors, trial groups, store, resume, reports) they
travel as these objects: the dicts exist only in ``to_dict`` / ``from_dict``, at a process or Ray
boundary (:mod:`harness.executors`) and in the files (``tests/test_trial_records.py`` holds it).
The trial file's key, checksum and checks (:func:`trial_key`, :func:`trial_checksum`,
:func:`read_trial_file`) are here too; :mod:`harness.store` uses them to write and read trial files.

This module imports nothing heavy (no torch): the store and the executors' parent process use
it without building a model. :func:`registry_for` gives a worker the registry of a spec's
plugins, built once per process.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import StoreError

def trial_key(variant: str, seed: int, point: str = "") -> str:
    """File-system-safe key of one trial: ``<variant>[__<sweep point>]__s<seed>``."""
    raw = f"{variant}__{point}__s{seed}" if point else f"{variant}__s{seed}"
    return re.sub(r"[^A-Za-z0-9_.=+-]", "_", raw)


def trial_lr(config: dict) -> float:
    """A trial's peak learning rate (:func:`harness.schedule.peak_lr`), its row's ``lr``; NaN when the
    config cannot be read (a measurement's)."""
    from .config import RunConfig
    from .errors import ConfigError
    from .schedule import peak_lr

    try:
        cfg = RunConfig.from_dict(config)
    except (ConfigError, KeyError, TypeError, ValueError):
        return float("nan")
    return peak_lr(cfg.train, cfg.model.d_model)


def lr_point(spec: "TrialSpec") -> bool:
    """Whether ``spec``'s sweep point changes ``train.lr`` alone (``run --lr-grid``, an experiment's ``[sweep]
    "train.lr"``: points named ``lr=VALUE``): such trials of one variant train as one vectorised group, each
    member at its own learning rate (:func:`harness.group.group_key`), with one group checkpoint."""
    return re.fullmatch(r"lr=[^,]+", spec.point or "") is not None


#: Trial status of a trial that ran to its end (the others: ``diverged``, ``invalid``, ``failed``).
OK = "ok"
#: Trial status of a trial that raised, or whose worker died: its ``reason`` says why.
FAILED = "failed"
#: Statuses of trials that produced no metrics: ``failed`` and ``timed_out`` (ended by ``run
#: --trial-timeout`` or ``--time-budget``, :mod:`harness.executors.limits`); tables and plots leave them out.
NO_RESULT = (FAILED, "timed_out")


@dataclass
class TrialSpec:
    """One trial as data: what :func:`harness.train.run_trial` takes.

    Attributes:
        variant: the variant's name.
        seed: the trial's seed (model initialisation, training batches, dropout).
        config: ``RunConfig.to_dict()`` of the trial (its task: ``config["train"]["task"]``).
        slots: ``{slot: component}`` of the variant as planned (unresolved defaults absent).
        device: ``"auto"``, ``"cpu"`` or ``"cuda"`` (resolved in the process that runs it).
        dtype: ``"fp32"`` or ``"bf16"`` (autocast).
        plugins: ``PluginSpec.to_dict()`` (the worker loads the same plugins), or None.
        threads: intra-op threads the trial pins (recorded in its row), or None (unchanged).
        point: the sweep point's name (``""`` when nothing is swept).
        measure: None for a training trial; for a measurement at initialisation, what to measure
            (:func:`harness.measure.measure`: ``{"kind", ...}``) instead of training.
        save_model: return the trained weights with the result (``run --save-models``; the run
            stores them as ``models/<key>.pt``: :mod:`harness.saved`).
        track: live tracking as the trial trains (``{"tensorboard": logdir, "mlflow": uri, "run": run
            id}``: :mod:`harness.track`), or None; set for the trials a run executes, never stored.
        checkpoint_dir: the folder of the trial's mid-trial checkpoint (``<run>/checkpoints``:
            :mod:`harness.checkpoint`), set by the run when it executes the trial; ``""``: none.
            Not part of the stored plan, nor of the trial's identity.
    """

    variant: str
    seed: int
    config: dict[str, Any]
    slots: dict[str, str] = field(default_factory=dict)
    device: str = "auto"
    dtype: str = "fp32"
    plugins: dict[str, Any] | None = None
    threads: int | None = None
    point: str = ""
    measure: dict[str, Any] | None = None
    save_model: bool = False
    track: dict[str, Any] | None = None
    checkpoint_dir: str = ""

    @property
    def key(self) -> str:
        """The trial's file-system-safe key (:func:`harness.trial.trial_key`)."""
        return trial_key(self.variant, self.seed, self.point)

    @property
    def task(self) -> str:
        """The name of the task the trial trains on (``train.task``)."""
        return str((self.config.get("train") or {}).get("task", "copy"))

    def to_dict(self) -> dict[str, Any]:
        """The plain dict of earlier versions (key order included): ``{"variant", "slots",
        "config", "seed", "device", "dtype", "plugins", "threads", "point"}``, then ``measure``
        for a measurement, ``save_model`` when true, ``track`` and ``checkpoint_dir`` when set."""
        out = {"variant": self.variant, "slots": dict(self.slots), "config": self.config, "seed": self.seed,
               "device": self.device, "dtype": self.dtype, "plugins": self.plugins, "threads": self.threads,
               "point": self.point}
        out |= {"measure": dict(self.measure)} if self.measure is not None else {}
        out |= {"save_model": True} if self.save_model else {}
        return out | ({"track": dict(self.track)} if self.track else {}) | (
            {"checkpoint_dir": self.checkpoint_dir} if self.checkpoint_dir else {})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrialSpec":
        """A spec from its dict; missing optional keys take the defaults above.

        Raises:
            KeyError: ``variant``, ``seed`` or ``config`` missing.
        """
        return cls(variant=d["variant"], seed=d["seed"], config=d["config"], slots=dict(d.get("slots") or {}),
                   device=d.get("device", "auto"), dtype=d.get("dtype", "fp32"), plugins=d.get("plugins"),
                   threads=d.get("threads"), point=d.get("point", ""), measure=d.get("measure"),
                   save_model=bool(d.get("save_model", False)), track=d.get("track"),
                   checkpoint_dir=str(d.get("checkpoint_dir") or ""))

    def identity_row(self, device: str, threads: int | None) -> dict[str, Any]:
        """The first columns of the trial's row: variant, its planned slots (``slot_<name>``,
        sorted), seed, ``device``, dtype, ``threads``, point and ``lr`` (:func:`trial_lr`)."""
        return {"variant": self.variant, **{f"slot_{k}": v for k, v in sorted(self.slots.items())},
                "seed": self.seed, "device": device, "dtype": self.dtype, "threads": threads, "point": self.point,
                "lr": trial_lr(self.config)}


#: Trial-row columns stored under their spelling before the project settled on "vectorise", by
#: today's name: a stored row (a trial file, an old ``trials.csv``) reads them as today's.
OLD_COLUMNS = {"vectorized": "vectorised", "vectorized_note": "vectorised_note"}


def current_row(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with any :data:`OLD_COLUMNS` key under today's name, in its place (``row`` itself when it
    has none)."""
    if not any(k in OLD_COLUMNS for k in row):
        return row
    return {OLD_COLUMNS.get(k, k): v for k, v in row.items()}


def current_header(csv_text: str) -> str:
    """The text of a stored ``trials.csv`` with any :data:`OLD_COLUMNS` name in its header line
    renamed (the rows unchanged), as today's trial files render it."""
    head, sep, body = csv_text.partition("\n")
    return ",".join(OLD_COLUMNS.get(c, c) for c in head.split(",")) + sep + body


@dataclass
class TrialResult:
    """What a trial returns and what ``trials/<key>.json`` stores (with a checksum).

    Attributes:
        row: the metrics row (one row of ``trials.csv``): the spec's identity
            (:meth:`TrialSpec.identity_row`), ``params``, the training, test and dev metrics of
            :func:`harness.train.train`, ``peak_mem_mb`` (MiB), ``wall_s`` and
            ``overhead_share``, ``status`` and ``reason`` (and ``traceback`` when it raised).
        curve: loss per step (``split: train``) and per dev evaluation (``split: dev``; ``heldout`` in
            runs stored before the dev split).
        phases: ``{phase: {"s": seconds, "calls": n}}`` of the trial's phase clock, or None
            (a trial that produced nothing: its worker died).
        extra: any other top-level keys of a stored result, kept as they were.
    """

    row: dict[str, Any]
    curve: list[dict[str, Any]] = field(default_factory=list)
    phases: dict[str, dict[str, float]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> str:
        """``ok``, ``diverged``, ``invalid`` or ``failed``."""
        return self.row.get("status", "")

    @property
    def reason(self) -> str:
        """Why the status is not ``ok`` (``""`` when it is)."""
        return self.row.get("reason", "")

    @property
    def key(self) -> str:
        """The trial's key, from its row (:func:`harness.trial.trial_key`)."""
        point = self.row.get("point") or ""
        return trial_key(self.row["variant"], self.row["seed"], point if isinstance(point, str) else str(point))

    def to_dict(self) -> dict[str, Any]:
        """``{"row", "curve"[, "phases"], ...extra}``: the JSON of earlier versions (the store adds
        the checksum)."""
        out: dict[str, Any] = {"row": self.row, "curve": self.curve}
        if self.phases is not None:
            out["phases"] = self.phases
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrialResult":
        """A result from its dict (as a pool or Ray worker sends it back, :mod:`harness.executors`, or
        as a trial file holds it, :meth:`harness.store.RunStore.read_trial`; ``checksum`` and ``key``
        are dropped; a row's :data:`OLD_COLUMNS` read under today's names)."""
        extra = {k: v for k, v in d.items() if k not in ("row", "curve", "phases", "checksum", "key")}
        return cls(row=current_row(d["row"]), curve=list(d.get("curve") or []), phases=d.get("phases"), extra=extra)

    @classmethod
    def failed(cls, spec: TrialSpec, reason: str) -> "TrialResult":
        """The result of a trial that produced nothing (its worker died, Ray lost it): the spec's
        identity, status ``failed`` and ``reason``, ``wall_s`` NaN; an empty curve, no phases."""
        row = {**spec.identity_row(spec.device, spec.threads), "status": FAILED, "reason": reason,
               "wall_s": math.nan}
        return cls(row=row)


# ---------------------------------------------------------------------------------------------
# the trial file: trials/<key>.json (written by harness.store.RunStore.write_trial)


def _json_default(o):
    if hasattr(o, "item"):
        return o.item()
    return str(o)


def canonical_json(payload: Any) -> str:
    """The canonical JSON of a trial's content: sorted keys, no spaces, tensors and numpy
    scalars as numbers (``.item()``), anything else as ``str``."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), default=_json_default)


def trial_checksum(payload: dict) -> str:
    """``sha256:<hex>`` of a trial's content (every key but ``checksum`` and ``key``), computed
    over its canonical JSON (sorted keys, no spaces), so reading and re-serialising gives the
    same digest."""
    body = {k: v for k, v in payload.items() if k not in ("checksum", "key")}
    return "sha256:" + hashlib.sha256(canonical_json(body).encode()).hexdigest()


class CorruptTrialError(StoreError):
    """A trial file that cannot be used: unreadable, not JSON, foreign, or changed after it
    was written. ``reason`` says which, in a few words."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


#: A trial file may be stored gzipped (``trials/<key>.json.gz``: the same JSON, its checksum over
#: the content, not the bytes); the harness writes ``.json`` and reads both. Committed reference
#: runs gzip trial files of long curves (a 36,000-step trial's per-step curve: 2.3 MB as JSON).
GZ_SUFFIX = ".json.gz"


def key_of_file(path: str | Path) -> str:
    """The trial key a file name stands for: ``<key>.json`` or ``<key>.json.gz`` -> ``<key>``."""
    name = Path(path).name
    return name[:-len(GZ_SUFFIX)] if name.endswith(GZ_SUFFIX) else Path(name).stem


def read_trial_file(path: str | Path) -> dict:
    """Read and check one ``trials/<key>.json``; returns its content.

    Checks: UTF-8 JSON object (gunzipped first for ``<key>.json.gz``); ``row`` an object with ``variant`` (str), ``seed`` (int) and
    ``status`` (str); ``curve`` (when present) a list of objects; the file name is the row's trial key
    (:func:`trial_key`); ``checksum`` (when present, i.e. written by this version) matches.

    Raises:
        CorruptTrialError: naming the first check that failed.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
        text = (gzip.decompress(raw) if path.name.endswith(GZ_SUFFIX) else raw).decode("utf-8")
    except OSError as exc:  # gzip.BadGzipFile and EOFError (a truncated .gz) included
        raise CorruptTrialError(path, f"cannot be read ({getattr(exc, 'strerror', None) or exc})") from exc
    except EOFError as exc:
        raise CorruptTrialError(path, "is a truncated gzip file") from exc
    except UnicodeDecodeError as exc:
        raise CorruptTrialError(path, f"is not UTF-8 text (byte {exc.start}); not a trial file") from exc
    if not text.strip():
        raise CorruptTrialError(path, "is empty (a truncated trial file)")
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise CorruptTrialError(path, f"is not valid JSON ({str(exc)[:120]}); a truncated or damaged trial file") \
            from exc
    if not isinstance(data, dict):
        raise CorruptTrialError(path, f"holds a JSON {type(data).__name__}, not a trial object (foreign file)")
    row = data.get("row")
    if not isinstance(row, dict):
        raise CorruptTrialError(path, "has no 'row' object; not a trial file (foreign file)")
    for name, kind in (("variant", str), ("seed", int), ("status", str)):
        value = row.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise CorruptTrialError(path, f"row.{name} should be {kind.__name__}, got {value!r}; "
                                          f"not a trial file (foreign file)")
    curve = data.get("curve", [])
    if not isinstance(curve, list) or not all(isinstance(c, dict) for c in curve):
        raise CorruptTrialError(path, "its 'curve' is not a list of objects; not a trial file (foreign file)")
    point = row.get("point") or ""
    key = trial_key(row["variant"], row["seed"], point if isinstance(point, str) else str(point))
    if key_of_file(path) != key:
        raise CorruptTrialError(path, f"holds trial {key!r}, not {key_of_file(path)!r} (renamed or copied from "
                                      f"another trial)")
    stored = data.get("checksum")
    if stored is not None:
        actual = trial_checksum(data)
        if stored != actual:
            raise CorruptTrialError(path, f"checksum mismatch (stored {str(stored)[:20]}..., content "
                                          f"{actual[:20]}...): changed after it was written")
    return data


_REGISTRIES: dict[str, Any] = {}


def _stamp(path: str) -> list:
    """``[path, modification time (ns), size]`` of a plugin file (``[path]`` when it cannot be read)."""
    try:
        st = os.stat(path)
    except (OSError, TypeError, ValueError):
        return [str(path)]
    return [str(path), st.st_mtime_ns, st.st_size]


def registry_for(plugins: dict[str, Any] | None):
    """The :class:`harness.registry.Registry` of a spec's ``plugins`` (``PluginSpec.to_dict()``;
    None: built-ins and installed entry points), built once per process and then shared: every
    trial a worker runs reuses it, until a ``--plugin`` file changes on disk (its modification time
    or size: then it is loaded again, so a process never runs an edited plugin file's old code).

    Raises:
        PluginError: as :meth:`harness.registry.Registry.from_plugins`.
    """
    from .plugins import PluginSpec
    from .registry import Registry

    key = json.dumps([plugins or {}, [_stamp(f) for f in (plugins or {}).get("files", [])]], sort_keys=True)
    if key not in _REGISTRIES:
        _REGISTRIES[key] = Registry.from_plugins(PluginSpec.from_dict(plugins))
    return _REGISTRIES[key]


__all__ = ["TrialSpec", "TrialResult", "registry_for", "trial_key", "trial_checksum", "read_trial_file",
           "key_of_file", "GZ_SUFFIX",
           "CorruptTrialError", "canonical_json", "OK", "FAILED"]
