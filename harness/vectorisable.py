"""Whether K seeds of a variant can run as one program, and whether its steps are captured.

- :func:`vectorise_problem`: the dry run a trial group makes before training (one
  vmapped forward and backward on the first stacked batch against each seed's own forward); a
  reason makes :mod:`harness.group` fall back to sequential trials with one log line.
- :func:`capture_wanted`: ``run --capture`` (and :data:`CAPTURE_ENV` under ``auto``) on this device.
- :func:`first_sentence`: the first sentence of an error, for those one-line reasons.
"""
from __future__ import annotations

import math
import os

import torch

from .config import RunConfig
from .env import autocast
from .errors import ConfigError, failure_reason
from .runmeta import CAPTURE
from .tasks.base import loss_fn
from .vstep import GroupStep

#: Relative gap allowed between a vmapped loss and the seed's own forward on the same batch before the
#: group is judged mis-batched (fp32: reordering the rows' sums moves a loss by ~1e-6; bf16 ~1e-2).
PROBE_RTOL = {"fp32": 1e-4, "bf16": 3e-2}

#: Environment variable read when ``--capture`` is ``auto`` (the default): ``off`` turns captured steps
#: (CUDA graphs, :class:`harness.vstep.CapturedStep`) of vectorised groups off, ``on``/``auto`` leave them
#: on with CUDA. An explicit ``run --capture on|off`` (:class:`harness.runmeta.Execution`) wins.
CAPTURE_ENV = "HARNESS_CAPTURE"


def capture_wanted(device: torch.device, mode: str = "auto") -> bool:
    """Whether a group on ``device`` steps through CUDA graphs: ``mode`` (``run --capture``) ``on`` or
    ``off``, or for ``auto`` :data:`CAPTURE_ENV` (default ``auto``); never off CUDA (``--capture on`` on
    the CPU is refused before the run: :meth:`harness.runmeta.Execution.resolved`).

    Raises:
        ConfigError: ``mode`` or :data:`CAPTURE_ENV` is not ``auto``, ``on`` or ``off``.
    """
    if mode not in CAPTURE:
        raise ConfigError(f"--capture must be auto, on or off, got {mode!r}")
    if mode == "auto":
        mode = capture_env()
    return device.type == "cuda" and mode != "off"


def capture_env() -> str:
    """:data:`CAPTURE_ENV`: ``auto`` (also when unset), ``on`` or ``off``.

    Raises:
        ConfigError: another value (the message names the variable and its values).
    """
    mode = os.environ.get(CAPTURE_ENV, "auto").strip().lower() or "auto"
    if mode not in CAPTURE:
        raise ConfigError(f"{CAPTURE_ENV} must be auto, on or off, got {mode!r}")
    return mode


def vectorise_problem(step: GroupStep, models: list[torch.nn.Module], batch: tuple, cfg: RunConfig,
                      device: torch.device, dtype: str) -> str | None:
    """Why ``step`` cannot train ``models`` as one group, or None when it can: one vmapped forward and
    backward (a group of one: its plain functional one, :class:`harness.vstep.GroupStep`) on ``batch``
    (src (K, B, S), tgt/tgt_y (K, B, T)) must run, leave every buffer as it was,
    and give per-seed losses equal (within :data:`PROBE_RTOL`) to each model's own forward on its rows
    (models with dropout are compared in eval mode). Parameters, moments and the global RNG are left
    unchanged."""
    before = {n: b.clone() for n, b in step.buffers.items()}
    devices = [device.index or 0] if device.type == "cuda" else []
    dropout = cfg.model.dropout > 0
    try:
        with torch.random.fork_rng(devices=devices):
            _, loss = step.grad_fn(step.params, step.buffers, *batch)
            if dropout:
                step.base.eval()
                with torch.no_grad():
                    loss = step.loss_fn(step.params, step.buffers, *batch)
    except Exception as exc:  # noqa: BLE001 - any error means: not vectorisable
        return f"its forward/backward does not run under torch.func.vmap ({first_sentence(failure_reason(exc))})"
    finally:
        step.base.train()
    changed = [n for n in before if not torch.equal(before[n], step.buffers[n])]
    if changed:
        for n in changed:
            step.buffers[n].copy_(before[n])
        return f"a module updates its buffer {changed[0]!r} in place during the forward"
    own = []
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        for i, m in enumerate(models):
            was = m.training
            m.train(not dropout)
            with autocast(device, dtype):
                logits = m(batch[0][i], batch[1][i])
            own.append(float(loss_fn(logits, batch[2][i], cfg.model.pad, cfg.train.label_smoothing)))
            m.train(was)
    got = loss.tolist()
    rtol = PROBE_RTOL.get(dtype, 1e-4)
    bad = [i for i, (a, b) in enumerate(zip(got, own))
           if not (math.isclose(a, b, rel_tol=rtol, abs_tol=1e-6) or (math.isnan(a) and math.isnan(b)))]
    if bad:
        i = bad[0]
        return (f"the vmapped loss of seed {i} of the group ({got[i]:.6g}) differs from its own forward's "
                f"({own[i]:.6g}) on the same batch: the modules do not batch correctly under vmap")
    return None


def first_sentence(text: str, limit: int = 200) -> str:
    """The first sentence of an error message (at most ``limit`` characters)."""
    cut = text.find(". ", 40)
    text = text[:cut + 1] if cut > 0 else text
    return text if len(text) <= limit else text[:limit - 3] + "..."
