"""Ray tasks (``--executor ray``): one trial per task, on a cluster or a private local one."""
from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterable

from ..env import available_cores, ray_address
from ..errors import HarnessError, failure_reason
from ..trial import TrialResult, TrialSpec
from .units import OnDone


def import_ray():
    """``import ray`` or a one-line HarnessError saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise HarnessError("--executor ray needs Ray, which is not installed "
                           "(pip install -e '.[ray]', or pip install 'ray>=2.9')") from exc
    return ray


def ray_trial(spec: dict, plugin_sources: dict[str, str]) -> dict:
    """The Ray task (the Ray boundary): :func:`harness.train.run_trial` on
    ``TrialSpec.from_dict(spec)``, its result as ``TrialResult.to_dict()``.

    Plugin files named with ``--plugin`` travel as source text in ``plugin_sources`` (absolute
    path -> text); on a node where the path does not exist the file is written to a private
    cache folder and loaded from there, so a cluster needs no shared file system.
    """
    from ..train import run_trial

    trial = TrialSpec.from_dict(spec)
    files = (trial.plugins or {}).get("files") or []
    if any(not os.path.isfile(f) for f in files):
        trial.plugins = dict(trial.plugins or {}, files=[_localise(f, plugin_sources) for f in files])
    return run_trial(trial).to_dict()


def _localise(path: str, sources: dict[str, str]) -> str:
    if os.path.isfile(path) or path not in sources:
        return path
    import hashlib
    import tempfile

    text = sources[path]
    folder = os.path.join(tempfile.gettempdir(), "harness-plugins",
                          hashlib.sha256(text.encode()).hexdigest()[:16])
    os.makedirs(folder, exist_ok=True)
    local = os.path.join(folder, os.path.basename(path))
    if not os.path.isfile(local):
        tmp = f"{local}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, local)
    return local


def _runtime_env(address: str, plugin_modules: list[str]) -> dict:
    """Ray runtime environment of the tasks.

    On an existing cluster (any address but ``local``) the ``harness`` and ``variants``
    packages and the ``-p`` plugin modules are uploaded with ``py_modules``, so the nodes need
    only the dependencies (torch, pluggy, pandas ...), not this checkout. The plugin-autoload
    switch travels as an environment variable so every worker loads the same plugins.
    """
    env: dict[str, Any] = {}
    env_vars = {k: os.environ[k] for k in ("HARNESS_DISABLE_PLUGIN_AUTOLOAD",) if k in os.environ}
    if address == "local":
        # same machine: workers see this checkout; make -p modules found from here importable
        paths = [os.getcwd()] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if plugin_modules:
            env_vars["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    else:
        import importlib

        import harness

        from ..plugins import BUILTIN_MODULES

        mods = [harness]
        for name in [*BUILTIN_MODULES, *plugin_modules]:  # the built-in plugins' packages, as any plugin's
            top = importlib.import_module(name.split(".")[0])
            if top not in mods:
                mods.append(top)
        env["py_modules"] = mods
    if env_vars:
        env["env_vars"] = env_vars
    return env


@contextlib.contextmanager
def ray_session(address: str | None = None, plugin_modules: list[str] | None = None,
                log: Callable[[str], None] | None = None):
    """Connect to (or start) the Ray cluster for the duration of the block; yields ``ray``.

    ``address`` as for :func:`ray_address`. A cluster this call starts (``local``) is shut down
    at the end; if Ray is already initialised in this process it is used as it is.

    Raises:
        HarnessError: Ray is missing or the cluster cannot be started or reached.
    """
    ray = import_ray()
    address = ray_address(address)
    started = False
    if not ray.is_initialized():
        if address == "local":
            # keep a private cluster on loopback and silent (no usage stats, no dashboard)
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        kwargs: dict[str, Any] = dict(address=address, runtime_env=_runtime_env(address, plugin_modules or []),
                                      log_to_driver=False, logging_level="ERROR")
        if address == "local":
            kwargs.update(include_dashboard=False, num_cpus=available_cores())
        try:
            ray.init(**kwargs)
        except Exception as exc:  # noqa: BLE001 - Ray raises many types for a bad address
            first = failure_reason(exc, limit=10_000).removeprefix(f"{type(exc).__name__}: ")
            raise HarnessError(f"cannot start or reach the Ray cluster at {address!r}: {first} "
                               f"(check --address / RAY_ADDRESS, or leave both unset for a local cluster)") from exc
        started = True
    try:
        if log and started:
            res = ray.cluster_resources()
            log(f"ray cluster {address}: {int(res.get('CPU', 0))} CPU(s), {int(res.get('GPU', 0))} GPU(s)")
        yield ray
    finally:
        if started:
            with contextlib.suppress(Exception):
                ray.shutdown()


def run_ray(specs: Iterable[TrialSpec], on_done: OnDone, address: str | None = None, cpus_per_trial: int = 1,
            gpus_per_trial: float = 0, log: Callable[[str], None] | None = None) -> None:
    """Run ``specs`` as Ray tasks (``--executor ray``), storing each as it ends.

    Args:
        specs: the trials (their ``threads`` = ``cpus_per_trial``).
        on_done: called in this process with ``(trial_spec, result)`` as each trial ends.
        address: cluster address (``ray://host:10001`` or ``host:6379``); default
            ``RAY_ADDRESS`` or a new local cluster (see :func:`ray_address`). Ignored when Ray is
            already initialised (e.g. inside :func:`ray_session`).
        cpus_per_trial: CPUs Ray reserves per task; the task uses that many torch threads.
        gpus_per_trial: GPUs per task (1 for ``--device cuda``).
        log: receives one line when the cluster is up.

    Raises:
        HarnessError: Ray missing, or the cluster cannot be reached.
        KeyboardInterrupt: passed on after the remaining tasks are cancelled.
    """
    specs = list(specs)
    plugins = (specs[0].plugins or {}) if specs else {}
    sources = {}
    for f in plugins.get("files") or []:
        with open(f, encoding="utf-8") as fh:
            sources[f] = fh.read()
    with ray_session(address, plugins.get("modules") or [], log) as ray:
        task = ray.remote(ray_trial).options(num_cpus=cpus_per_trial, num_gpus=gpus_per_trial, max_retries=1)
        refs = {task.remote(ts.to_dict(), sources): ts for ts in specs}
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1, timeout=1.0)
                for ref in done:
                    ts = refs[ref]
                    try:
                        result = TrialResult.from_dict(ray.get(ref))
                    except ray.exceptions.RayError as exc:  # the task or its worker died
                        result = TrialResult.failed(ts, f"ray: {failure_reason(exc)}")
                    on_done(ts, result)
        except BaseException:
            for ref in pending:
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=True)
            raise
