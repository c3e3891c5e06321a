"""The process a trial or a measurement runs in: devices, threads, the process-wide settings
every trial applies, peak memory, and the environment block every report starts with.

Process-wide settings every trial (and ``harness bench``) applies, see :func:`trial_settings`:
deterministic algorithms, denormals flushed to zero on CPU, no NaN-filling of fresh memory.
The environment block (:func:`environment`) records them with the versions, threads and CPU
features that can move results (Bouthillier et al. 2021).
"""
from __future__ import annotations

import contextlib
import os
import platform
import re
import resource
from typing import Any, Iterator

import torch

from .errors import DeviceError

#: What :func:`trial_settings` sets, as reported in :func:`environment`.
TRIAL_SETTINGS = {
    "deterministic_algorithms": "on (warn_only)",
    "flush_denormal": "on (CPU: subnormal floats read and written as 0)",
    "fill_uninitialized_memory": "off",
    "optimizer": "Adam fused=True where supported, else foreach=True",
}


#: Environment variable choosing the prefix-only logits' pass (:mod:`harness.tasks.prefix`):
#: ``auto`` (default: ``batched`` on CUDA, ``loop`` elsewhere), ``loop`` or ``batched`` (:func:`prefix_pass`);
#: :func:`environment` records the pass its device gets.
PREFIX_ENV = "HARNESS_PREFIX_PASS"


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda when available else cpu. Raises DeviceError for unavailable cuda."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise DeviceError("--device cuda requested but CUDA is not available here (use --device cpu or auto)")
    if name not in ("cpu",) and not name.startswith("cuda"):
        raise DeviceError(f"unknown device {name!r} (use auto, cpu or cuda)")
    return torch.device(name)


def trial_settings() -> None:
    """Apply the process-wide settings of :data:`TRIAL_SETTINGS` (idempotent, cheap).

    * ``torch.use_deterministic_algorithms(True, warn_only=True)``.
    * ``torch.utils.deterministic.fill_uninitialized_memory = False``: deterministic mode
      otherwise NaN-fills every new tensor (a debugging aid that costs a memory pass per
      allocation, about 2 % of a step); correct code never reads uninitialised memory.
    * ``torch.set_flush_denormal(True)`` (CPU): subnormal floats (|x| < 1.2e-38) are treated
      as 0. Adam's second moment of tiny bf16-autocast gradients turns subnormal, and x86
      handles subnormals in microcode: the optimizer step was 2-4x slower without it.
      Values that small are far below Adam's eps = 1e-9 and never change an update.
    """
    global _SETTINGS_APPLIED
    torch.use_deterministic_algorithms(True, warn_only=True)
    import torch.utils.deterministic as _det

    _det.fill_uninitialized_memory = False
    torch.set_flush_denormal(True)
    _SETTINGS_APPLIED = True


#: Whether this process has called :func:`trial_settings` (torch has no getter for flush-denormal).
_SETTINGS_APPLIED = False


def _settings_line(applied: bool, deterministic: bool) -> str:
    """The environment block's ``trial_settings`` line: :data:`TRIAL_SETTINGS`, with deterministic
    algorithms marked off where they were turned off after the settings (``bench --nondeterministic``)."""
    if not applied:
        return "not applied (torch defaults: deterministic algorithms off)"
    items = dict(TRIAL_SETTINGS)
    if not deterministic:
        items["deterministic_algorithms"] = "off (turned off after the trial settings: torch's and Inductor's)"
    return "; ".join(f"{k}: {v}" for k, v in items.items())


def pin_threads(threads: int | None) -> int:
    """Pin ``torch.set_num_threads(threads)`` when ``threads`` is given (results are bitwise
    reproducible for the same seed, config, device and threads); returns the intra-op threads
    this process now uses."""
    if threads:
        torch.set_num_threads(int(threads))
    return torch.get_num_threads()


@contextlib.contextmanager
def threads_pinned(threads: int | None) -> Iterator[int]:
    """``torch.set_num_threads(threads)`` inside the block (nothing when None), restored afterwards;
    yields the intra-op threads in use."""
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(int(threads))
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def deterministic_cuda() -> None:
    """Make cuBLAS deterministic in this process: a fixed workspace
    (``CUBLAS_WORKSPACE_CONFIG=:4096:8``, read when its handle is created; an existing value is
    kept)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def trial_device(name: str) -> torch.device:
    """:func:`resolve_device` for a trial, with ``cudnn.benchmark`` off on CUDA (its autotuner
    picks kernels by timing, so two runs could compute differently).

    Raises:
        DeviceError: as :func:`resolve_device`.
    """
    device = resolve_device(name)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = False
    return device


def autocast(device: torch.device, dtype: str):
    """The forward pass's autocast context: ``torch.autocast(device.type, torch.bfloat16)``
    for ``dtype="bf16"`` (matmuls in bfloat16, parameters and loss in float32), disabled
    (a no-op) for ``"fp32"``."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=(dtype == "bf16"))


def reset_peak_mem(device: torch.device) -> None:
    """Start a new peak-memory window: CUDA ``reset_peak_memory_stats``; CPU (Linux) resets
    the process's peak resident set size (``echo 5 > /proc/self/clear_refs``)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_mem_mb(device: torch.device) -> float:
    """Peak memory since :func:`reset_peak_mem`, in MiB (2^20 bytes; the ``_mb`` suffix is the
    stored column's name, ``peak_mem_mb``).

    CUDA: ``torch.cuda.max_memory_allocated`` (tensors only). CPU: the process's peak
    resident set size (``VmHWM``; the Python interpreter and torch's libraries included,
    about 300 MiB); where ``/proc`` is missing, ``ru_maxrss`` (the peak over the process's life).
    """
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        with open("/proc/self/status") as f:
            m = re.search(r"^VmHWM:\s+(\d+)\s+kB", f.read(), re.M)
        if m:
            return int(m.group(1)) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def environment(device: torch.device | str = "cpu", trial_settings_applied: bool | None = None) -> dict[str, Any]:
    """Versions, threads, CPU features and flags that can move results (Bouthillier et al. 2021).

    ``trial_settings_applied``: whether the work this block describes runs under
    :func:`trial_settings` (``run``'s trials do, in whatever process runs them); default:
    whether this process has applied them, and whether its deterministic algorithms are still on
    (``bench --nondeterministic`` turns them off after the settings; flush-denormal stays).
    ``deterministic`` and ``trial_settings`` report it.
    """
    if trial_settings_applied is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
        applied = _SETTINGS_APPLIED or deterministic
    else:
        applied = deterministic = trial_settings_applied
    commit = git_commit(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_flags": " ".join(_cpu_flags()) or "unknown",
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "device": str(device),
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32 if torch.cuda.is_available() else None,
        "deterministic": deterministic,
        "trial_settings": _settings_line(applied, deterministic),
        "git_commit": commit,
    }
    try:  # the evaluation's prefix pass on this device: harness.tasks.prefix
        env["prefix_pass"] = prefix_pass(device)
    except ValueError:
        env["prefix_pass"] = os.environ[PREFIX_ENV].strip()
    return env


def prefix_pass(device: torch.device | str | None = None) -> str:
    """How prefix-only logits run (:mod:`harness.tasks.prefix`): ``loop`` or ``batched``, the value of
    :data:`PREFIX_ENV`, or for ``auto`` (also when unset) ``batched`` on a CUDA ``device`` (launch-bound
    there) and ``loop`` elsewhere (arithmetic-bound). Read at each call, so worker processes inherit it.

    Raises:
        ValueError: another value (the message names the variable and its choices).
    """
    mode = os.environ.get(PREFIX_ENV, "auto").strip().lower() or "auto"
    if mode not in ("auto", "loop", "batched"):
        raise ValueError(f"{PREFIX_ENV} must be auto, loop or batched, got {mode!r}")
    if mode == "auto":
        return "batched" if device is not None and torch.device(device).type == "cuda" else "loop"
    return mode


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


#: CPU features that decide matmul speed (x86 ``/proc/cpuinfo`` names)
_SPEED_FLAGS = ("fma", "avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_tile", "amx_bf16")


def _cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return [fl for fl in _SPEED_FLAGS if fl in have]
    except OSError:
        pass
    return []


# ---------------------------------------------------------------------------------------------
# cores and clusters: what --jobs, --threads and --executor ray size themselves from


#: The folders (of the checkout) whose uncommitted changes make a run's code differ from its commit.
CODE_DIRS = ("harness", "variants")


def git_commit(root: str) -> str:
    """The checkout's short commit hash, with ``+uncommitted`` when tracked files under
    :data:`CODE_DIRS` differ from it (the run's code is then not that commit's); ``unknown``
    outside a git checkout or without git."""
    import subprocess

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=root, timeout=5).stdout.strip()
        if not commit:
            return "unknown"
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", *CODE_DIRS], capture_output=True,
                               cwd=root, timeout=5).returncode == 1
        return commit + ("+uncommitted" if dirty else "")
    except Exception:  # noqa: BLE001
        return "unknown"


def available_cores() -> int:
    """CPU cores this process may use (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def threads_per_trial(jobs: int, threads: int | None = None, cores: int | None = None) -> int:
    """Intra-op threads for each of ``jobs`` concurrent trials: ``threads`` when given, else
    ``max(1, cores // jobs)`` so that ``jobs`` workers never oversubscribe ``cores``."""
    if threads:
        return int(threads)
    return max(1, (cores or available_cores()) // max(1, jobs))


def ray_address(address: str | None) -> str:
    """``--address``, else ``RAY_ADDRESS``, else ``"local"`` (a new private local cluster; a bare
    ``ray.init()`` would attach to a stale cluster left on this machine)."""
    return address or os.environ.get("RAY_ADDRESS") or "local"
