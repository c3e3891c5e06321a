"""A run's ``config.json`` as typed records: :class:`RunMeta` and the small records inside it
(:class:`Execution`, :class:`TrialEntry`, :class:`Resume`).

Every record has ``from_dict`` / ``to_dict`` that accept and produce exactly the JSON that earlier
versions stored: ``to_dict(from_dict(d)) == d``, keys in the stored order, so rewriting an old
run's ``config.json`` (a resume, a status update) changes only what the code changed. Stored
JSON compatibility lives here, in ``from_dict``:

- a missing key reads as the field's empty value (None for an optional field) and is not written
  back unless the code sets it;
- a known key whose value has another type than the field's (a hand-edited or foreign file) is
  kept as it was in ``extra`` and the field reads empty, so readers see "not recorded" and the
  value still survives a round trip;
- an unknown key (a plugin's, a later version's) is kept in ``extra``, in its place.

Written only through :class:`harness.store.RunStore` (``create``, ``write_meta``); read with
:meth:`harness.store.RunStore.meta` or :func:`harness.store.load_run`.
"""
from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any

_NUMBER = (int, float)


def _f(types: tuple, default: Any = None, *, missing: Any = None, always: bool = False, record: Any = None,
       many: bool = False, factory: Any = None) -> Any:
    """A record field: ``types`` its JSON types; ``missing`` what a missing key reads as (the
    default of an optional field); ``always``: written even when empty (a record built in code);
    ``record``: its value is that record type (``many``: a list of them)."""
    meta = {"types": types, "missing": missing, "always": always, "record": record, "many": many}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    if default is MISSING:
        return field(metadata=meta)
    return field(default=default, metadata=meta)


def _extra() -> Any:
    return field(default_factory=dict, metadata={"skip": True})


def _keys() -> Any:
    """The stored key order (None: built in code); not compared, not shown."""
    return field(default=None, repr=False, compare=False, metadata={"skip": True})


def _decode(spec: dict, value: Any) -> tuple[bool, Any]:
    """``(ok, typed value)`` of a stored ``value`` for a field described by ``spec``."""
    rec = spec["record"]
    if rec is not None and spec["many"]:
        if not isinstance(value, list) or not all(isinstance(x, dict) and rec.accepts(x) for x in value):
            return False, None
        return True, [rec.from_dict(x) for x in value]
    if rec is not None:
        return (True, rec.from_dict(value)) if isinstance(value, dict) and rec.accepts(value) else (False, None)
    if value is None:
        return spec["missing"] is None, None  # null: "not recorded" for an optional field only
    types = spec["types"]
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    return ok, value if ok else None


def _encode(value: Any) -> Any:
    if isinstance(value, list):
        return [_encode(v) for v in value]
    return value.to_dict() if hasattr(value, "to_dict") and not isinstance(value, dict) else value


class Record:
    """Base of the stored records: dataclass fields named as their JSON keys, ``extra`` (keys kept
    as stored) and ``_keys`` (the stored key order)."""

    #: Field names in the order a record built in code writes them (default: the fields' order).
    ORDER: tuple[str, ...] = ()
    #: Field names a stored object must hold, as their types, for :meth:`accepts`.
    REQUIRED: tuple[str, ...] = ()

    @classmethod
    def _fields(cls):
        return [f for f in fields(cls) if not f.metadata.get("skip")]

    @classmethod
    def accepts(cls, d: dict) -> bool:
        """Whether ``d`` holds the keys a record of this type cannot do without, well typed."""
        by_name = {f.name: f for f in cls._fields()}
        return all(k in d and _decode(by_name[k].metadata, d[k])[0] and d[k] is not None for k in cls.REQUIRED)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Any:
        """The record of a stored JSON object (see the module docstring for missing, ill-typed and
        unknown keys)."""
        kw: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        names = set()
        for f in cls._fields():
            names.add(f.name)
            required = f.default is MISSING and f.default_factory is MISSING
            ok, value = _decode(f.metadata, d[f.name]) if f.name in d else (False, None)
            if ok:
                kw[f.name] = value
                continue
            if f.name in d:
                extra[f.name] = d[f.name]
            if required or f.default_factory is not MISSING:
                kw[f.name] = _missing(f)
        extra.update({k: v for k, v in d.items() if k not in names})
        return cls(**kw, extra=extra, _keys=tuple(d))

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: each field that was stored, was set by the code or is always written;
        ``extra``; in the stored key order (new keys after, in :attr:`ORDER`)."""
        stored = self._keys
        out: dict[str, Any] = {}
        by_name = {f.name: f for f in self._fields()}
        for name in self.ORDER or tuple(by_name):
            f = by_name[name]
            value = getattr(self, name)
            if name in (stored or ()) or (stored is None and f.metadata["always"]) or value != _missing(f):
                out[name] = _encode(value)
        out.update(self.extra)
        if stored:
            place = {k: i for i, k in enumerate(stored)}
            out = dict(sorted(out.items(), key=lambda kv: place.get(kv[0], len(place))))
        return out


def _missing(f) -> Any:
    m = f.metadata["missing"]
    return m() if callable(m) else m


@dataclass
class Execution(Record):
    """How a run's trials were executed (``ExecutionOptions.to_dict()``): ``executor``
    (``local``/``ray``), ``jobs`` (worker processes), ``threads`` (intra-op threads per trial,
    None: unchanged), ``address`` (a Ray cluster's, or None), ``vectorize_seeds`` (``on``: the seeds
    of a variant trained as vectorised trial groups; absent in runs made before it existed)."""

    executor: str = _f((str,), "local", missing="local", always=True)
    jobs: int | str = _f((int, str), 1, missing=1, always=True)  # "auto" before it is resolved
    threads: int | None = _f((int,), None, always=True)
    address: str | None = _f((str,), None, always=True)
    vectorize_seeds: str | None = _f((str,), None)  # "on"/"off" (``run --vectorize-seeds``); None: before it existed
    capture: str | None = _f((str,), None)  # "auto"/"on"/"off" (``run --capture``); None: before it existed
    extra: dict[str, Any] = _extra()
    _keys: tuple | None = _keys()


@dataclass
class TrialEntry(Record):
    """One planned trial of a training run: its ``key`` (``trials/<key>.json``) and ``spec``
    (``harness.trial.TrialSpec.to_dict()``; empty when not recorded)."""

    key: str = _f((str,), "", missing="", always=True)
    spec: dict[str, Any] = _f((dict,), factory=dict, missing=dict, always=True)
    extra: dict[str, Any] = _extra()
    _keys: tuple | None = _keys()
    REQUIRED = ("key",)


@dataclass
class Resume(Record):
    """One ``run --resume`` of a run: its ``command``, trials ``missing`` before it, the keys it
    ``retried`` (``--retry-failed``) and its :class:`Execution`."""

    command: str = _f((str,), "", missing="", always=True)
    missing: int = _f((int,), 0, missing=0, always=True)
    retried: list[str] = _f((list,), factory=list, missing=list, always=True)
    execution: Execution | None = _f((dict,), None, record=Execution)
    extra: dict[str, Any] = _extra()
    _keys: tuple | None = _keys()


@dataclass
class RunMeta(Record):
    """A run's ``config.json``: the fields every kind of run records, then each kind's own
    (None: not recorded), then ``extra`` (keys no harness code reads: a plugin's, a later
    version's, or a known key with a foreign value), each in its stored place.

    Every kind: ``kind`` (``train``: no ``kind`` key on disk; ``bench``, ``profile``, ``check`` or an
    experiment's measurement kind), ``command``, ``preset``, ``config`` (``RunConfig.to_dict()``),
    ``variants``, ``device``, ``environment`` (:func:`harness.env.environment`), ``seeds``,
    ``dtype``, ``plugins`` (``PluginSpec.to_dict()``), ``run_id`` (the folder name, added by
    :meth:`harness.store.RunStore.create`).

    A training run (``python -m harness run``) and an experiment's: ``experiment`` (its name;
    ``""`` none), ``points`` (``{sweep point: RunConfig.to_dict()}``), ``config_hash``,
    ``execution``, ``status`` (``running``, ``complete``, ``interrupted``), ``trials`` (planned,
    :class:`TrialEntry`), ``heldout`` (the evaluation set's note), ``check`` (check's classes,
    :func:`harness.overview.check_classes`), ``run_wall_s`` (seconds, summed over resumes),
    ``resumes``, ``experiment_spec`` and ``cli_overrides`` (an experiment file's run).

    ``bench``: ``dtypes``, ``steps``, ``warmup_steps``, ``reference``, ``peak_gflop_per_s``
    (``{dtype: GFLOP/s}``), ``bench_s``; ``bench --old``: ``old`` (the old arm's ``--set`` items),
    ``old_dtype``. ``check``: ``equivalent``, ``tf32``, ``check_wall_s``, ``ok``.
    """

    kind: str = _f((str,), MISSING, missing="train")
    command: str = _f((str,), MISSING, missing="", always=True)
    preset: str = _f((str,), MISSING, missing="", always=True)
    config: dict[str, Any] = _f((dict,), MISSING, missing=dict, always=True)
    variants: list[str] = _f((list,), MISSING, missing=list, always=True)
    device: str = _f((str,), MISSING, missing="", always=True)
    environment: dict[str, Any] = _f((dict,), MISSING, missing=dict, always=True)
    seeds: list[int] | None = _f((list,))
    dtype: str | None = _f((str,))
    plugins: dict[str, Any] | None = _f((dict,))
    run_id: str | None = _f((str,))
    # a training run's and an experiment's
    experiment: str | None = _f((str,))
    points: dict[str, dict] | None = _f((dict,))
    config_hash: str | None = _f((str,))
    execution: Execution | None = _f((dict,), record=Execution)
    status: str | None = _f((str,))
    trials: list[TrialEntry] | None = _f((list,), record=TrialEntry, many=True)
    heldout: str | None = _f((str,))
    experiment_spec: dict[str, Any] | None = _f((dict,))
    cli_overrides: list[str] | None = _f((list,))
    check: dict[str, Any] | None = _f((dict,))
    run_wall_s: float | None = _f(_NUMBER)
    resumes: list[Resume] | None = _f((list,), record=Resume, many=True)
    # a bench's
    dtypes: list[str] | None = _f((list,))
    steps: int | None = _f((int,))
    warmup_steps: int | None = _f((int,))
    reference: str | None = _f((str,))
    peak_gflop_per_s: dict[str, float] | None = _f((dict,))
    bench_s: float | None = _f(_NUMBER)
    old: list[str] | None = _f((list,))
    old_dtype: str | None = _f((str,))
    # a check record's
    equivalent: dict[str, Any] | None = _f((dict,))
    tf32: str | None = _f((str,))
    check_wall_s: float | None = _f(_NUMBER)
    ok: bool | None = _f((bool,))
    extra: dict[str, Any] = _extra()
    _keys: tuple | None = _keys()

    ORDER = ("kind", "command", "preset", "config", "variants", "seeds", "device", "dtype", "plugins",
             "environment", "experiment", "points", "config_hash", "execution", "status", "trials", "heldout",
             "experiment_spec", "cli_overrides", "run_id", "check", "run_wall_s", "resumes",
             "dtypes", "steps", "warmup_steps", "reference", "peak_gflop_per_s", "bench_s",
             "old", "old_dtype", "equivalent", "tf32", "check_wall_s", "ok")

    @property
    def is_training(self) -> bool:
        """A run of ``python -m harness run`` (no ``kind`` key on disk)."""
        return self.kind == "train"

    def planned_keys(self) -> list[str]:
        """The planned trials' keys (empty: none recorded)."""
        return [t.key for t in self.trials or []]
