"""Resume validation: may a stored run be continued with this code, these plugins and these options?

``python -m harness run --resume results/<run-id>`` runs only a run's missing trials. Before
anything runs, the stored ``config.json`` is checked here, in this order:

1. :func:`stored_specs`: it holds a trial list and a config hash (written by ``run``);
2. :func:`check_code_config`: this code reads the stored configs as they were written (same
   config hash, every trial's config round-trips);
3. :func:`check_registered_components`: every stored trial's components are registered (the same plugins);
   :func:`check_code`: the project's code and every plugin file are those that trained the run's
   latest trials (:mod:`harness.provenance`), unless ``--allow-code-change``;
4. the options given with ``--resume`` ask for nothing else than the stored run:
   :func:`check_plugins`, :func:`check_setting` (device, dtype), :func:`check_points` (config
   and sweep points) and :func:`check_trials` (variants x seeds x points).

5. :func:`keep_baseline`: a resume keeps the baseline recorded at the start.

:func:`compare` makes every comparison, in this order, in one call. Every refusal is a
:class:`harness.errors.StoreError` naming the first difference; nothing stored is touched.
:func:`harness.planning.plan_resume` turns the options into the requested plan (:class:`Requested`); this
module only compares.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .config import RunConfig
from .settings import hash_view
from .errors import HarnessError, StoreError
from .provenance import code_changes, latest_code, write_sources
from .registry import Variant
from .runner import make_specs
from .runmeta import RunMeta
from .store import RunStore, config_hash
from .trial import TrialSpec

@dataclass
class Requested:
    """What a resume request asks for beyond the stored run; None or False where the option was not given.
    ``plan``: ``() -> (variant names, seeds, [(point name, RunConfig)])`` the given options resolve to, called
    only when ``config`` (config options given: compare the points) or ``trials`` (trial options given: compare
    the trials) asks for it."""

    plugins: dict | None = None
    device: str | None = None
    dtype: str | None = None
    plan: Callable[[], tuple[list[str], list[int], list]] | None = None
    config: bool = False
    trials: bool = False
    baseline: str | None = None


def compare(store: RunStore, meta: RunMeta, reg, code_now: dict, requested: Requested,
            allow_code_change: bool = False) -> tuple[list[TrialSpec], list[str] | None]:
    """Every comparison of the stored run with a resume request, in the module docstring's order; returns the
    stored trials and the code changes :func:`check_code` allowed (None: none).

    Raises:
        StoreError: naming the first difference (the given options themselves bad: HarnessError)."""
    specs = stored_specs(store, meta)
    where = str(store.root)
    check_code_config(store, meta, specs)
    check_registered_components(reg, specs, where)
    changes = check_code(meta, code_now, where, allow_code_change)
    if requested.plugins is not None:
        check_plugins(requested.plugins, meta, where)
    if requested.device is not None:
        check_setting("device", requested.device, meta, where)
    if requested.dtype is not None:
        check_setting("dtype", requested.dtype, meta, where)
    if requested.plan is not None and (requested.config or requested.trials):
        variants, seeds, points = requested.plan()
        if requested.config:
            check_points(points, meta, where)
        if requested.trials:
            check_trials(variants, seeds, points, specs, where)
    keep_baseline(requested.baseline, meta, where)
    return specs, changes


#: Added to every refusal of other options: what to do instead.
AGAIN = "leave the options out to resume as stored, or start a new run"


def refusal(where: str) -> str:
    """The start of every "other options" refusal for the run folder ``where``."""
    return f"cannot resume {where!r} with other options than it was started with"


def _flat(d, prefix: str = "") -> dict:
    out = {}
    for k, v in (d or {}).items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def first_difference(stored: dict, requested: dict) -> str:
    """``"key: stored X, requested Y"`` for the first (dotted, sorted) key whose values differ."""
    a, b = _flat(stored), _flat(requested)
    for key in sorted(set(a) | set(b)):
        if a.get(key, "<unset>") != b.get(key, "<unset>"):
            return f"{key}: stored {a.get(key, '<unset>')!r}, requested {b.get(key, '<unset>')!r}"
    return "no field differs"


def stored_specs(store: RunStore, meta: RunMeta) -> list[TrialSpec]:
    """The run's planned trials from its ``config.json`` (``meta``).

    Raises:
        StoreError: ``meta`` has no trial list and config hash (not written by ``run``).
    """
    if meta.trials is None or meta.config_hash is None or not meta.config:
        raise StoreError(f"{str(store.root)!r} is not a resumable run: its config.json has no trial list and "
                         f"config hash (it was not written by 'python -m harness run')")
    return list(meta.trials)


def check_code_config(store: RunStore, meta: RunMeta, specs: list[TrialSpec]) -> None:
    """Refuse a run whose stored configs this code reads differently (its config fields or
    defaults changed): the config hash this code computes must equal the stored one.

    Raises:
        StoreError: the hashes or a trial's config round trip differ.
    """
    where = str(store.root)
    try:
        code_hash = config_hash(RunConfig.from_dict(meta.config).to_dict())
    except HarnessError as exc:
        raise StoreError(f"cannot resume {where!r}: this version of the harness cannot read its config ({exc}); "
                         f"start a new run") from exc
    if code_hash != meta.config_hash:
        raise StoreError(f"cannot resume {where!r}: config hash mismatch (stored {meta.config_hash}, this code "
                         f"computes {code_hash}; the harness's config changed since the run began); start a new run")
    for ts in specs:
        try:
            again = RunConfig.from_dict(ts.config).to_dict()
        except (HarnessError, KeyError, TypeError) as exc:
            raise StoreError(f"cannot resume {where!r}: trial {ts.key} has a config this version of the harness "
                             f"cannot read ({exc}); start a new run") from exc
        if hash_view(again) != hash_view(ts.config):  # a key added since, at its default, reads the same
            raise StoreError(f"cannot resume {where!r}: trial {ts.key}'s config reads differently with this code "
                             f"({first_difference(ts.config, again)}); start a new run")


def check_registered_components(reg, specs: list[TrialSpec], where: str) -> None:
    """Every stored trial's components must be registered in ``reg`` (same plugins loaded).

    Raises:
        StoreError: naming the trial and the missing component.
    """
    for ts in specs:
        for slot, comp in Variant(ts.variant, dict(ts.slots)).resolved(reg.defaults).items():
            try:
                reg.component(slot, comp)
            except HarnessError as exc:
                raise StoreError(f"cannot resume {where!r}: trial {ts.key} needs {exc} (load the plugins the "
                                 f"run was started with)") from exc


def check_code(meta: RunMeta, now: dict, where: str, allow: bool = False) -> list[str] | None:
    """This code (``now``: :func:`harness.provenance.current_code`'s record) against the code that
    trained the run's latest trials (:func:`harness.provenance.latest_code`).

    Returns:
        The differences, one line each (empty: the same code); None when the run recorded no code
        (made before it was recorded: nothing to compare).

    Raises:
        StoreError: the code differs and ``allow`` (``--allow-code-change``) is not given; one line
            naming every difference.
    """
    before = latest_code(meta)
    if before is None:
        return None
    changes = code_changes(before, now)
    if changes and not allow:
        raise StoreError(f"cannot resume {where!r}: the code changed since its trials were trained: "
                         f"{'; '.join(changes)} (give --allow-code-change to go on with this code, which the "
                         f"run records, or start a new run)")
    return changes


def check_plugins(requested: dict, meta: RunMeta, where: str) -> None:
    """The ``-p``/``--plugin`` plugins given with ``--resume`` (a ``PluginSpec.to_dict()``) are
    the stored ones.

    Raises:
        StoreError: naming the stored and the requested list.
    """
    have = meta.plugins or {}
    for k in ("modules", "files"):
        if list(requested.get(k, [])) != list(have.get(k, [])):
            raise StoreError(f"{refusal(where)}: plugin {k} stored {have.get(k, [])}, requested "
                             f"{requested.get(k, [])} (leave out -p/--plugin to use the stored ones)")


def check_setting(name: str, requested: str, meta: RunMeta, where: str) -> None:
    """A run-wide setting given with ``--resume`` (``device``, ``dtype``) equals the stored one.

    Raises:
        StoreError: naming the option, the stored and the requested value.
    """
    stored = getattr(meta, name)
    if requested != stored:
        raise StoreError(f"{refusal(where)}: --{name} stored {stored!r}, requested {requested!r} "
                         f"(leave out --{name} to use the stored one)")


def check_points(points: list[tuple[str, RunConfig]], meta: RunMeta, where: str) -> None:
    """The requested configs (``[(point name, config)]``; one unnamed point without a sweep) are
    the stored ones: same sweep point names, same config hash per point.

    Raises:
        StoreError: naming the point and the first differing config field.
    """
    stored = dict([("", meta.config)] if not meta.points else list(meta.points.items()))
    requested = {name: cfg.to_dict() for name, cfg in points}
    if set(stored) != set(requested):
        raise StoreError(f"{refusal(where)}: sweep points stored {sorted(stored)}, requested {sorted(requested)} "
                         f"({AGAIN})")
    for name, cfg in requested.items():
        if config_hash(cfg) != config_hash(stored[name]):
            label = f" (point {name})" if name else ""
            raise StoreError(f"{refusal(where)}: requested config{label} hash {config_hash(cfg)} != stored "
                             f"{config_hash(stored[name])}; {first_difference(stored[name], cfg)} ({AGAIN})")


class _Named:
    """What :func:`harness.runner.make_specs` reads of a variant to make trial keys: its name."""

    def __init__(self, name: str):
        self.name, self.slots = name, {}


def check_trials(variants: list[str], seeds: list[int], points: list[tuple[str, RunConfig]],
                 specs: list[TrialSpec], where: str) -> None:
    """The requested trials (variant names x seeds x points) are exactly the stored ones.

    Raises:
        StoreError: with the count (and the first three keys) of trials not in the run and left out.
    """
    keys = {ts.key for ts in make_specs([_Named(n) for n in variants], seeds, points[0][1], "cpu", "fp32", {},
                                        points=points)}
    stored = {ts.key for ts in specs}
    if keys != stored:
        extra, lost = sorted(keys - stored), sorted(stored - keys)
        raise StoreError(f"{refusal(where)}: requested trials differ from the stored ones ("
                         f"{len(extra)} not in the run{': ' + ', '.join(extra[:3]) if extra else ''}; "
                         f"{len(lost)} left out{': ' + ', '.join(lost[:3]) if lost else ''}; {AGAIN})")


def record_code(store: RunStore, entry, code, changes: list[str] | None, kept: set[str], log) -> None:
    """A resume's record of its code: nothing when it is the code that trained the run's latest trials
    (``changes`` empty); else ``entry`` gets the new ``code``, its ``code_changes`` (allowed by
    ``--allow-code-change``; None for a run that recorded no code) and the trials ``kept`` from before,
    the run folder a copy of each new plugin file (:class:`harness.provenance.CodeState` ``code``), and ``log``
    (the run's log) one line."""
    if changes == []:
        return
    entry.code, entry.code_changes, entry.kept = code.record, changes, sorted(kept)
    write_sources(store.root, code)
    if changes is None:
        log("note: this run recorded no code (made before the code was recorded): the code that trained its "
            f"{len(kept)} stored trial(s) is unknown; this resume's code is recorded from now on")
    else:
        log(f"code changed since the run's trials were trained, going on (--allow-code-change): {'; '.join(changes)}")


def keep_baseline(requested: str | None, meta: RunMeta, where: str) -> None:
    """``--baseline`` with ``--resume``: the stored run keeps the baseline it recorded (a run stored
    before the choice was recorded takes the one given).

    Raises:
        StoreError: another baseline than the recorded one (the message says how to re-render).
        ConfigError: a variant the run does not hold."""
    from .report import choose_baseline

    if requested is None or requested == meta.baseline:
        return
    if meta.baseline:
        raise StoreError(f"{where} compares with {meta.baseline!r}, recorded at its start; --resume keeps it "
                         f"(for another comparison: python -m harness report {where} --baseline {requested})")
    meta.baseline = choose_baseline(requested, list(meta.variants))
