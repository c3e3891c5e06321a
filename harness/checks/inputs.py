"""What every check starts from: the check config, the padded batch, the reference canonical state,
and the small helpers the checks, the probes and the component contracts share.

A leaf module: of :mod:`harness.checks` it imports only :mod:`harness.checks.policy`'s constants (itself a leaf
that imports nothing of the package), so every other module of the package (and
:mod:`harness.checks.properties`, :mod:`harness.checks.contracts`) imports it at module level without a cycle.

Shape letters: B batch, S source length, T target length.
"""
from __future__ import annotations

import contextlib
import math
import os
import traceback
import zlib

import torch
from torch import nn

from ..config import ModelConfig
from ..errors import ConfigError
from .policy import LONGEST_ROW


#: The model the checks build by default: small enough that ``check --variants all`` takes
#: seconds on a 2-core CPU; dropout > 0 so the train-mode probes run with dropout active.
CHECK_MODEL = ModelConfig(N=2, d_model=32, h=4, d_ff=64, dropout=0.1, vocab=11, pad=0, max_len=32)


def fmt_size(x: float | None) -> str:
    """A size for messages: "—" for None, "0", "inf", 3 significant digits or 1.23e-05."""
    if x is None:
        return "—"
    if x == 0:
        return "0"
    if not math.isfinite(x):
        return str(x)
    return f"{x:.2e}" if abs(x) < 1e-2 or abs(x) >= 1e4 else f"{x:.3g}"


def autocast(device: torch.device, dtype: str):
    """``torch.autocast(bfloat16)`` on ``device`` for ``dtype == "bf16"``, else a no-op context."""
    if dtype == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def non_pad(shape, cfg: ModelConfig, g: torch.Generator) -> torch.Tensor:
    """Token ids of ``shape`` drawn uniformly from the ``cfg.vocab - 1`` non-pad ids (int64)."""
    ids = torch.randint(0, cfg.vocab - 1, shape, generator=g)
    return ids + (ids >= cfg.pad).long()


def padded_batch(cfg: ModelConfig, batch: int = 4, src_len: int = 9, tgt_len: int = 10,
                 seed: int = 0, long_rows: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A batch with real right padding: row i ends with min(i, L - 2) pad tokens in both source and target.

    Tokens are drawn uniformly from the non-pad ids. ``src_len != tgt_len`` on purpose, so a
    component that confuses the two lengths fails. With ``long_rows`` > 0 and ``cfg.max_len`` beyond both
    lengths, ``long_rows`` more rows (drawn after the others, which keep their tokens) as long as the model
    takes: target width T' = min(max_len, :data:`harness.checks.policy.LONGEST_ROW`), source width T' - 3, the last
    long row with 3 pad tokens at the end of each; the short rows are padded to those widths. A component that is
    right only on short rows (a table indexed ``pos % 16``, a layer position-wise only up to 16) thus shows in
    every whole-model comparison.

    Returns:
        ``(src (B, S), tgt (B, T), labels (B, T))`` int64 on the CPU; labels are random non-pad ids.

    Raises:
        ConfigError: lengths beyond ``cfg.max_len`` or fewer than 2 tokens.
    """
    if not 2 <= src_len <= cfg.max_len or not 2 <= tgt_len <= cfg.max_len:
        raise ConfigError(f"check batch lengths must be in [2, max_len={cfg.max_len}], got S={src_len}, T={tgt_len}")
    g = torch.Generator().manual_seed(seed)
    src = non_pad((batch, src_len), cfg, g)
    tgt = non_pad((batch, tgt_len), cfg, g)
    labels = non_pad((batch, tgt_len), cfg, g)
    for i in range(batch):
        src[i, src_len - min(i, src_len - 2):] = cfg.pad
        tgt[i, tgt_len - min(i, tgt_len - 2):] = cfg.pad
    t_long = min(cfg.max_len, LONGEST_ROW)
    if long_rows <= 0 or t_long - 3 <= max(src_len, tgt_len):
        return src, tgt, labels
    s_long = t_long - 3  # != T; room for the extra-padding probe's 3 source pads
    extra = [non_pad((long_rows, s_long), cfg, g), non_pad((long_rows, t_long), cfg, g), non_pad((long_rows, t_long), cfg, g)]
    if long_rows > 1:
        extra[0][-1, -3:] = cfg.pad
        extra[1][-1, -3:] = cfg.pad
    widened = [nn.functional.pad(x, (0, w - x.size(1)), value=cfg.pad) for x, w in ((src, s_long), (tgt, t_long),
                                                                                   (labels, t_long))]
    return tuple(torch.cat([a, b]) for a, b in zip(widened, extra))


def starting(batch, cfg: ModelConfig):
    """``batch`` (a :func:`padded_batch`) with every target row's first token the start symbol 1, as every
    task's decoder input begins (when the vocabulary has one: ``vocab > 2`` and ``pad != 1``), so that a
    component keyed on the start symbol shows what it does to real rows (``tests/plugins/adv_start_symbol_leak.py``).
    A new tuple; the input is not changed."""
    src, tgt, labels = batch
    if cfg.vocab > 2 and cfg.pad != 1:
        tgt = tgt.clone()
        tgt[:, 0] = 1
    return src, tgt, labels


def long_rows_of(batch, short_rows: int):
    """The long rows of a :func:`padded_batch` made with ``long_rows`` (the rows after its first ``short_rows``),
    ``(src (L, S'), tgt (L, T'), labels (L, T'))``; None when it has none."""
    return None if batch[0].size(0) <= short_rows else tuple(x[short_rows:] for x in batch)


def draw_reference_state(shapes: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, torch.Tensor]:
    """Random canonical parameters, each a function of (seed, name) only (float32, CPU).

    Matrices: Xavier-uniform. ``*.bias`` with a sibling ``*.weight`` matrix: U(-1/sqrt(fan_in),
    1/sqrt(fan_in)). Other vectors: ``*.weight`` 1 + 0.1 N(0, 1) (LayerNorm gains), the rest
    U(-0.1, 0.1). Unlike ``canonical_init`` LayerNorms are not left at 1 and 0, so a mapping
    that swaps or drops them shows in the checks.
    """
    out = {}
    for name in sorted(shapes):
        shape = tuple(shapes[name])
        g = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(("check:" + name).encode())) % (2**63))
        t = torch.empty(shape)
        if len(shape) >= 2:
            nn.init.xavier_uniform_(t, generator=g)
        elif name.endswith("weight"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)
        else:
            sibling = shapes.get(name[: -len("bias")] + "weight") if name.endswith("bias") else None
            bound = 1.0 / math.sqrt(sibling[1]) if sibling is not None and len(sibling) == 2 else 0.1
            t.uniform_(-bound, bound, generator=g)
        out[name] = t
    return out


#: Frames in these files are the check machinery, not the code under check: a crash description
#: skips them (the component contracts and the probes stay named: they call into components).
_MACHINERY = frozenset(os.path.join(os.path.dirname(os.path.abspath(__file__)), f) for f in (
    "__init__.py", "inputs.py", "policy.py", "expectations.py", "runs.py", "pairs.py", "masks.py", "mha.py",
    "transformer.py", "transformer_lm.py", "ties.py", "whole.py", "render.py", "report.py", "sections.py", "stages.py", "formulas.py",
    "gate.py"))


def describe_exception(exc: BaseException) -> str:
    """``"RuntimeError: <first line> (at variants/bugs.py:79 in forward -> variants/attention.py:186 in split)"``:
    the two innermost frames outside torch and outside the check machinery (:data:`_MACHINERY`), caller
    first."""
    msg = str(exc).strip().splitlines()[0][:240] if str(exc).strip() else ""
    torch_dir = os.path.dirname(torch.__file__)
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith(torch_dir) and os.path.abspath(f.filename) not in _MACHINERY]
    where = []
    for f in frames[-2:]:
        path = f.filename
        with contextlib.suppress(ValueError):
            rel = os.path.relpath(path)
            path = rel if not rel.startswith("..") else path
        where.append(f"{path}:{f.lineno} in {f.name}")
    return f"{type(exc).__name__}: {msg}" + (f" (at {' -> '.join(where)})" if where else "")
