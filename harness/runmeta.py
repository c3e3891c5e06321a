"""A run's ``config.json`` as typed records: :class:`RunMeta` and the small records inside it
(:class:`Execution`, :class:`Resume`; the planned trials are :class:`harness.trial.TrialSpec` s).

Every record has ``from_dict`` / ``to_dict`` that accept and produce exactly the JSON that earlier
versions stored: ``to_dict(from_dict(d)) == d``, keys in the stored order, so rewriting an old
run's ``config.json`` (a resume, a status update) changes only what the code changed. Stored
JSON compatibility lives here, in ``from_dict``:

- a missing key reads as the field's empty value (None for an optional field) and is not written
  back unless the code sets it;
- a known key whose value has another type than the field's (a hand-edited or foreign file) is
  kept as it was in ``extra`` and the field reads empty, so readers see "not recorded" and the
  value still survives a round trip;
- an unknown key (a plugin's, a later version's) is kept in ``extra``, in its place;
- a key stored under a field's old name (``_f(old=...)``: ``execution.vectorize_seeds``, the spelling
  before the project settled on "vectorise") reads as the field and is written back under the name it
  was stored with.

Written only through :class:`harness.store.RunStore` (``create``, ``write_meta``); read with
:meth:`harness.store.RunStore.meta` or :func:`harness.store.load_run`.
"""
from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from .trial import TrialSpec

_NUMBER = (int, float)


def _f(types: tuple, default: Any = None, *, missing: Any = None, always: bool = False, record: Any = None,
       many: bool = False, factory: Any = None, codec: tuple | None = None, old: tuple[str, ...] = ()) -> Any:
    """A record field: ``types`` its JSON types; ``missing`` what a missing key reads as (the
    default of an optional field); ``always``: written even when empty (a record built in code);
    ``record``: its value is that record type (``many``: a list of them); ``codec``: ``(decode,
    encode)`` of a value stored in another form (``decode(json) -> (ok, typed)``); ``old``: earlier
    names of its key, read as this field (see the module docstring)."""
    meta = {"types": types, "missing": missing, "always": always, "record": record, "many": many, "codec": codec,
            "old": old}
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
    if spec["codec"] is not None:
        return spec["codec"][0](value)
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


def _key(f, stored: tuple | None) -> str:
    """The JSON key of field ``f`` in a record stored with keys ``stored``: an old name of it when
    only that was stored, else the field's name."""
    if stored and f.name not in stored:
        return next((k for k in f.metadata["old"] if k in stored), f.name)
    return f.name


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

    def __setattr__(self, name: str, value: Any) -> None:
        """Set a declared field. Raises AttributeError for any other name: :meth:`to_dict` writes fields
        and ``extra`` only, so an undeclared attribute would be dropped from the stored file unnoticed."""
        if name not in self.__dataclass_fields__:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}: declare it (or put it in extra)")
        object.__setattr__(self, name, value)

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
            key = _key(f, tuple(d))
            names.add(key)
            required = f.default is MISSING and f.default_factory is MISSING
            ok, value = _decode(f.metadata, d[key]) if key in d else (False, None)
            if ok:
                kw[f.name] = value
                continue
            if key in d:
                extra[key] = d[key]
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
            value, key = getattr(self, name), _key(f, stored)
            if key in (stored or ()) or (stored is None and f.metadata["always"]) or value != _missing(f):
                codec = f.metadata["codec"]
                out[key] = codec[1](value) if codec is not None and value is not None else _encode(value)
        out.update(self.extra)
        if stored:
            place = {k: i for i, k in enumerate(stored)}
            out = dict(sorted(out.items(), key=lambda kv: place.get(kv[0], len(place))))
        return out


def _missing(f) -> Any:
    m = f.metadata["missing"]
    return m() if callable(m) else m


#: ``--executor`` choices: ``local`` (this process, or a process pool with ``--jobs N``) and ``ray``.
EXECUTORS = ("local", "ray")
#: Largest ``--jobs`` (worker processes) and ``--threads`` (threads per trial) accepted.
MAX_WORKERS = 1024
#: ``--vectorise-seeds`` choices (:class:`Execution`), and the most seeds one vectorised group trains.
VECTORISE = ("auto", "on", "off")
#: The ``run`` flag's spelling before the project settled on "vectorise": still accepted, not shown by ``--help``.
OLD_VECTORISE_FLAG = "--vectorize-seeds"
MAX_GROUP = 64
#: ``--jobs auto`` on CUDA with vectorised seeds: worker processes sharing the one device.
GPU_JOBS = 4
#: ``--capture`` choices (:class:`Execution`).
CAPTURE = ("auto", "on", "off")


@dataclass
class Execution(Record):
    """How trials are executed (``run --jobs/--executor/--address/--threads/--vectorise-seeds``):
    the options a request asks for and, resolved (:meth:`resolved`), the record a run stores as
    ``execution`` in its ``config.json`` (and per ``run --resume`` in ``resumes``).

    Args:
        executor: ``local`` (this process when ``jobs == 1``, else a process pool) or ``ray``.
        jobs: concurrent local worker processes (``local`` only), >= 1, or ``"auto"`` before
            :meth:`resolved`.
        threads: torch intra-op threads per trial; default ``max(1, cores // jobs)`` locally,
            1 on Ray (where it is also the CPUs reserved per task). None: not pinned.
        address: Ray cluster address (``ray`` only); default ``RAY_ADDRESS`` or a local cluster.
        vectorise_seeds: ``on``: the seeds of one variant x config train as vectorised trial groups
            (:mod:`harness.group`), in this process or, with ``jobs > 1``, one group per worker
            process; ``off``: one trial after another; ``auto`` (resolved by :meth:`resolved`): ``on``
            on CUDA with the local executor, where it pays, ``off`` on the CPU, where it measured
            0.87-1.24x. A run stored before the
            option existed has no ``vectorise_seeds`` key: it reads as ``auto`` and is written back
            without one; a run stored with the key's old spelling ``vectorize_seeds`` reads it as this
            field and keeps that spelling when its ``config.json`` is rewritten.
        capture: the training step of a vectorised trial group as CUDA graphs
            (:class:`harness.vstep.CapturedStep`): ``auto`` (on with CUDA, unless the environment
            variable ``HARNESS_CAPTURE`` says ``off``), ``on`` (CUDA only: refused on the CPU by
            :meth:`resolved`), ``off``. A run stored before the option existed reads as ``auto``.
    """

    executor: str = _f((str,), "local", missing="local", always=True)
    jobs: int | str = _f((int, str), 1, missing=1, always=True)  # "auto" before it is resolved
    threads: int | None = _f((int,), None, always=True)
    address: str | None = _f((str,), None, always=True)
    vectorise_seeds: str = _f((str,), "auto", missing="auto", old=("vectorize_seeds",))  # stored resolved: on/off
    capture: str = _f((str,), "auto", missing="auto", always=True)  # absent in runs made before it existed
    trial_timeout: float | None = _f(_NUMBER)
    time_budget: float | None = _f(_NUMBER)
    extra: dict[str, Any] = _extra()
    _keys: tuple | None = _keys()

    def validate(self) -> "Execution":
        """These options, checked.

        Raises:
            UnknownNameError: an executor not in :data:`EXECUTORS`.
            ConfigError: a value out of range or options that do not go together.
        """
        from .errors import ConfigError, UnknownNameError

        if self.executor not in EXECUTORS:
            raise UnknownNameError("executor", self.executor, EXECUTORS)
        if self.jobs != "auto" and (not isinstance(self.jobs, int) or self.jobs < 1):
            raise ConfigError(f"--jobs must be 'auto' or >= 1, got {self.jobs}")
        if self.jobs != "auto" and self.jobs > MAX_WORKERS:
            raise ConfigError(f"--jobs must be at most {MAX_WORKERS}, got {self.jobs}")
        if self.threads is not None and not 1 <= self.threads <= MAX_WORKERS:
            raise ConfigError(f"--threads must be between 1 and {MAX_WORKERS}, got {self.threads}")
        if self.executor == "ray" and self.jobs not in (1, "auto"):
            raise ConfigError("--jobs applies to local worker processes; with --executor ray the cluster's "
                              "CPUs decide the parallelism (use --threads for CPUs per trial)")
        if self.address and self.executor != "ray":
            raise ConfigError(f"--address {self.address} needs --executor ray")
        if self.vectorise_seeds not in VECTORISE:
            raise ConfigError(f"--vectorise-seeds must be one of {', '.join(VECTORISE)}, got {self.vectorise_seeds!r}")
        if self.vectorise_seeds == "on" and self.executor != "local":
            raise ConfigError("--vectorise-seeds on trains groups of seeds in local processes: use it with the "
                              f"local executor (got --executor {self.executor})")
        if self.capture not in CAPTURE:
            raise ConfigError(f"--capture must be one of {', '.join(CAPTURE)}, got {self.capture!r}")
        if self.capture == "on" and self.vectorise_seeds == "off":
            raise ConfigError("--capture on captures the steps of vectorised trial groups: it needs --vectorise-seeds "
                              "on or auto, not off")
        check_limits(self.trial_timeout, self.time_budget, self.executor)
        return self

    def resolved(self, n_trials: int, device: str, n_groups: int | None = None) -> "Execution":
        """A new record of these options with ``vectorise_seeds="auto"`` and ``jobs="auto"`` decided:
        on the CPU, one worker process per core (at most one per trial) with one thread each; on
        CUDA with vectorised seeds and more than one trial group (``n_groups``, default
        ``n_trials``), :data:`GPU_JOBS` worker processes (at most one per group and per core), each
        training one group at a time on the same device; on Ray or for a single trial, 1 (this process).

        Why: at the ``quick`` preset's sizes a step is hundreds of small ops, so a second
        intra-op thread gains little (1.2-1.6x per step measured on 2 cores), while two
        one-thread trials side by side gain nearly 2x: ``run --variants all`` took 122 s
        with one process x 2 threads and 77 s with 2 processes x 1 thread (docs/benchmarks.md).
        Timings per trial are then taken with 1 thread next to another trial; for speed
        comparisons use ``harness bench`` (one process, interleaved) or ``--jobs 1``. On a GPU a
        small model's captured step leaves the chip mostly idle and each trial spends seconds on
        the host (build, checks, evaluation), so groups of different variants side by side overlap
        that host time (docs/benchmarks.md, "How long does the main job take?").
        """
        if self.capture == "on" and not device.startswith("cuda"):
            from .errors import ConfigError

            raise ConfigError(f"--capture on needs a CUDA device (CUDA graphs); this run's device is {device}: "
                              "use --capture auto or off")
        vectorise, jobs = self.vectorise_seeds, self.jobs
        if vectorise == "auto":
            vectorise = "on" if device.startswith("cuda") and self.executor == "local" else "off"
        if jobs == "auto":
            jobs = 1
            if self.executor == "local" and n_trials > 1:
                from .env import available_cores

                if device == "cpu" and vectorise != "on":
                    jobs = max(1, min(n_trials, available_cores() // max(1, int(self.threads or 1))))
                elif device.startswith("cuda") and vectorise == "on":
                    jobs = max(1, min(GPU_JOBS, n_trials if n_groups is None else n_groups, available_cores()))
        return Execution(self.executor, jobs, self.threads, self.address, vectorise, self.capture,
                         self.trial_timeout, self.time_budget)

    def trial_threads(self) -> int:
        """Intra-op threads each trial runs with under these options."""
        if self.executor == "ray":
            return int(self.threads or 1)
        from .env import threads_per_trial

        return threads_per_trial(self.jobs, self.threads)

    def describe(self) -> str:
        """One line for the run's headline, e.g. ``2 worker processes x 1 thread(s)``."""
        if self.executor == "ray":
            from .env import ray_address

            return f"ray cluster {ray_address(self.address)}, {self.trial_threads()} thread(s) per trial"
        limits = "".join(f", {what} {_seconds(v)}" for what, v in (("each trial stopped after", self.trial_timeout),
                                                                      ("time budget", self.time_budget)) if v)
        if self.vectorise_seeds == "on":
            where = ("this process" if self.jobs == 1 and not limits else
                     "1 worker process" if self.jobs == 1 else f"{self.jobs} worker processes, one group each at a time")
            return (f"{where}, {self.trial_threads()} thread(s), seeds vectorised in groups of up to {MAX_GROUP}"
                    + limits)
        if self.jobs == 1:
            return ("1 worker process" if limits else "this process") + f", {self.trial_threads()} thread(s){limits}"
        return f"{self.jobs} worker processes x {self.trial_threads()} thread(s){limits}"

    def limited(self) -> bool:
        """Whether a time limit is set (``--trial-timeout`` or ``--time-budget``): every trial then runs in a
        worker process of its own that can be ended (:mod:`harness.executors.limits`)."""
        return bool(self.trial_timeout or self.time_budget)


def _seconds(value: float) -> str:
    return f"{value:g} s"


def check_limits(trial_timeout: Any, time_budget: Any, executor: str = "local") -> None:
    """``--trial-timeout`` and ``--time-budget``: None or a positive, finite number of seconds, with the
    local executor (a Ray task is not ended by the harness).

    Raises:
        ConfigError: naming the option and the value.
    """
    import math

    from .errors import ConfigError

    for flag, value in (("--trial-timeout", trial_timeout), ("--time-budget", time_budget)):
        if value is None:
            continue
        if not isinstance(value, _NUMBER) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
            raise ConfigError(f"{flag} must be a positive number of seconds, got {value!r}")
        if executor != "local":
            raise ConfigError(f"{flag} ends trials in local worker processes; it cannot be used with "
                              f"--executor {executor} (leave it out, or use the local executor)")


def _decode_planned(value: Any) -> tuple[bool, list[TrialSpec] | None]:
    """``config.json``'s ``trials`` (``[{"key": str, "spec": TrialSpec.to_dict()}, ...]``) as
    :class:`harness.trial.TrialSpec` s; ``(False, None)`` (the list kept as stored, in ``extra``)
    unless every entry is exactly what :func:`_encode_planned` writes back (no trial of this
    harness's runs differs), so rewriting ``config.json`` never changes its trial list."""
    if not isinstance(value, list):
        return False, None
    out = []
    for entry in value:
        if not isinstance(entry, dict) or list(entry) != ["key", "spec"] or not isinstance(entry["spec"], dict):
            return False, None
        try:
            spec = TrialSpec.from_dict(entry["spec"])
        except (KeyError, TypeError, ValueError):
            return False, None
        back = spec.to_dict()
        if spec.key != entry["key"] or back != entry["spec"] or list(back) != list(entry["spec"]):
            return False, None
        out.append(spec)
    return True, out


def _encode_planned(specs: list[TrialSpec]) -> list[dict[str, Any]]:
    return [{"key": s.key, "spec": s.to_dict()} for s in specs]


@dataclass
class Resume(Record):
    """One ``run --resume`` of a run: its ``command``, trials ``missing`` before it, the keys it
    ``retried`` (``--retry-failed``) and its :class:`Execution`; when it ran other code than the run's
    latest record (``--allow-code-change``, or a run that recorded none): that ``code``
    (:mod:`harness.provenance`), the ``code_changes`` (one line each) and the trials ``kept`` (stored
    before it, so trained by the older code)."""

    command: str = _f((str,), "", missing="", always=True)
    missing: int = _f((int,), 0, missing=0, always=True)
    retried: list[str] = _f((list,), factory=list, missing=list, always=True)
    execution: Execution | None = _f((dict,), None, record=Execution)
    code: dict[str, Any] | None = _f((dict,))  # only when the code differs from the latest recorded
    code_changes: list[str] | None = _f((list,))
    kept: list[str] | None = _f((list,))
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
    ``dtype``, ``plugins`` (``PluginSpec.to_dict()``), ``code`` (the code that made it:
    :mod:`harness.provenance`; None in a run made before it was recorded), ``run_id`` (the folder name, added by
    :meth:`harness.store.RunStore.create`).

    A training run (``python -m harness run``) and an experiment's: ``experiment`` (its name;
    ``""`` none), ``points`` (``{sweep point: RunConfig.to_dict()}``), ``config_hash``,
    ``execution``, ``status`` (``running``, ``complete``, ``interrupted``), ``trials`` (the planned trials as
    :class:`harness.trial.TrialSpec` s, stored as ``[{"key", "spec": TrialSpec.to_dict()}]``), ``heldout`` (the evaluation set's note), ``check`` (check's classes,
    :func:`harness.overview.check_classes`), ``baseline`` (the variant the others are compared with;
    absent in runs stored before it was recorded), ``run_wall_s`` (seconds, summed over resumes),
    ``resumes``, ``experiment_spec`` and ``cli_overrides`` (an experiment file's run), ``lr_grid``
    (``run --lr-grid``: ``{"default": the config's train.lr, "values": [...]}``).

    ``bench``: ``dtypes``, ``steps``, ``warmup_steps``, ``reference``, ``peak_gflop_per_s``
    (``{dtype: GFLOP/s}``), ``bench_s``; ``bench --old``: ``old`` (the old arm's ``--set`` items),
    ``old_dtype``; ``bench --group-sizes``: ``group_sizes``; ``bench --compile``: ``compile_modes``; ``bench --nondeterministic``: ``nondeterministic``
    (true: timed without deterministic algorithms). ``check``: ``equivalent``, ``tf32``, ``check_wall_s``, ``ok``.
    """

    kind: str = _f((str,), MISSING, missing="train")
    command: str = _f((str,), MISSING, missing="", always=True)
    preset: str = _f((str,), MISSING, missing="", always=True)
    config: dict[str, Any] = _f((dict,), MISSING, missing=dict, always=True)
    variants: list[str] = _f((list,), MISSING, missing=list, always=True)
    device: str = _f((str,), MISSING, missing="", always=True)
    environment: dict[str, Any] = _f((dict,), MISSING, missing=dict, always=True)
    code: dict[str, Any] | None = _f((dict,))
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
    trials: list[TrialSpec] | None = _f((list,), codec=(_decode_planned, _encode_planned))
    heldout: str | None = _f((str,))
    experiment_spec: dict[str, Any] | None = _f((dict,))
    cli_overrides: list[str] | None = _f((list,))
    check: dict[str, Any] | None = _f((dict,))
    baseline: str | None = _f((str,))
    run_wall_s: float | None = _f(_NUMBER)
    resumes: list[Resume] | None = _f((list,), record=Resume, many=True)
    lr_grid: dict[str, Any] | None = _f((dict,))
    # a bench's
    dtypes: list[str] | None = _f((list,))
    steps: int | None = _f((int,))
    warmup_steps: int | None = _f((int,))
    reference: str | None = _f((str,))
    peak_gflop_per_s: dict[str, float] | None = _f((dict,))
    bench_s: float | None = _f(_NUMBER)
    old: list[str] | None = _f((list,))
    old_dtype: str | None = _f((str,))
    group_sizes: list[int] | None = _f((list,))
    compile_modes: list[str] | None = _f((list,))
    nondeterministic: bool | None = _f((bool,))
    # a check record's
    equivalent: dict[str, Any] | None = _f((dict,))
    tf32: str | None = _f((str,))
    check_wall_s: float | None = _f(_NUMBER)
    ok: bool | None = _f((bool,))
    extra: dict[str, Any] = _extra()
    _keys: tuple | None = _keys()

    ORDER = ("kind", "command", "preset", "config", "variants", "seeds", "device", "dtype", "plugins",
             "environment", "code", "experiment", "points", "config_hash", "execution", "status", "trials", "heldout",
             "experiment_spec", "cli_overrides", "run_id", "check", "baseline", "run_wall_s", "resumes", "lr_grid",
             "dtypes", "steps", "warmup_steps", "reference", "peak_gflop_per_s", "bench_s",
             "old", "old_dtype", "group_sizes", "compile_modes", "nondeterministic", "equivalent", "tf32", "check_wall_s", "ok")

    @property
    def is_training(self) -> bool:
        """A run of ``python -m harness run`` (no ``kind`` key on disk)."""
        return self.kind == "train"

    def planned_keys(self) -> list[str]:
        """The planned trials' keys (empty: none recorded)."""
        return [t.key for t in self.trials or []]
