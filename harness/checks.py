"""Equivalence checks and mask probes: which variants compute the same function, and which leak.

Shape letters: B batch, S source length, T target length, D = d_model, H = h heads, V vocabulary.

The recipe (PyTorch's own, ``test/test_transformers.py`` ``check_out_and_grad``):

1. Every variant under check loads **one reference canonical state** (:func:`draw_reference_state`:
   Xavier-uniform matrices, biases U(-1/sqrt(fan_in), +), LayerNorm gains 1 + 0.1 N(0, 1) and
   biases U(-0.1, 0.1), so a swapped or dropped LayerNorm parameter shows). Two variants thus hold
   the same parameters under every canonical name they share -- the same as copying A's
   parameters into B through the canonical layout -- without building N^2 models. What a variant
   cannot hold (a bias in a bias-free projection, three different matrices in one shared
   embedding) is listed as a lossy-load note.
2. Eval mode, one padded batch (:func:`padded_batch`: real source and target padding, S != T),
   cross-entropy against fixed labels at the real (non-pad) target positions; record the logits at
   real target positions and the gradient of every canonical parameter.
3. The same variant again in float64 (the "golden" run). ``ref_error`` = max |run - golden| per
   tensor: how far this variant's own rounding takes it.
4. Across variants A, B: max |A - B| per tensor against ``threshold = max(atol, fudge * max(ref_error_A,
   ref_error_B))`` with ``atol``/``fudge`` from :data:`TOLERANCES`, the one table keyed by
   (dtype, device). |A64 - B64| is reported too: ~1e-15 means the two compute the same function,
   anything larger is a real (declared or not) difference.

Verdicts per pair: ``identical`` (bitwise equal logits and gradients), ``equivalent`` (every tensor
within its threshold), ``differs as declared`` (the variants use components in some slot that are
not declared equivalent, or cannot hold the same parameters, and the size of the difference is
reported), ``differs unexpectedly`` (declared equivalent, measured different: a failure) and
``no difference (declared different)`` (a declared difference that does not show: reported, not a
failure -- the component's own check against its slot already says whether it changes anything).
What is declared comes from the components' registrations (:func:`harness.contracts.declared_groups`:
components that declare nothing are held to their slot's reference and so to each other;
``equivalent_to=`` and ``differs=`` say otherwise); ``--equivalent SLOT=A,B`` (``groups=``) overrides.

Every component the selected variants use is first held to its slot's reference on its own
(:mod:`harness.contracts`); ``all_components=True`` (``check --all-components``) checks every
registered component instead.

Against PyTorch: every attention component vs ``torch.nn.MultiheadAttention`` with mapped weights
(packed ``in_proj_weight`` = [w_q; w_k; w_v], its bool masks meaning True = blocked), and whole
encoder-decoder stacks vs ``torch.nn.Transformer(norm_first=False/True)`` given the same embedded
inputs (the embeddings and generator live outside ``nn.Transformer``).

Mask probes need no reference: changing the tokens at padded source positions (masks kept) or the
target tokens after position t must leave the logits at real positions (up to t) unchanged, in eval
and in train mode. Train mode uses dropout > 0 with the RNG re-seeded before each forward, so both
forwards drop exactly the same units (same shapes, same draw order) and only the perturbed tokens
differ; this exercises the mask together with attention dropout, which dropout 0 in train mode would
not.

Sources: Vaswani et al. 2017 §3.2; PyTorch ``test_transformers.py`` (golden float64 reference,
fudge factor 5) and ``torch.testing`` default tolerances; seed notes 001 and 002 for the bugs.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import os
import re
import time
import traceback
import warnings
import zlib
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
from torch import nn
from torch.nn import functional as F

from .config import ModelConfig
from .errors import ConfigError, HarnessError
from .model import BuildContext, build_model, canonical_state_dict, load_canonical_state_dict, unique_parameter_count
from .probes import _autocast, _fmt, _non_pad  # one definition each, shared
from .registry import SLOTS, Registry, Variant

# --------------------------------------------------------------------------- tolerances


@dataclass(frozen=True)
class Tolerance:
    """How close two runs must be to count as the same function.

    Args:
        atol: absolute floor of the threshold (same unit as the compared tensor).
        fudge: multiplier on the reference error (error of a run against its own float64 run).
        note: where the numbers come from / the policy they assume.
    """

    atol: float
    fudge: float
    note: str = ""

    ref_cap: float = math.inf

    def threshold(self, ref_error: float, scale: float | None = None) -> float:
        """``max(atol, fudge * ref_error)`` (PyTorch ``check_out_and_grad``); ``atol`` if ``ref_error`` is
        not finite. With ``scale`` (max |float64 value| of the compared tensor) ``ref_error`` is first
        capped at ``max(ref_cap * scale, 100 * atol)``: a run whose error against its own float64 run is far beyond
        rounding (a component that is right only in float64) must not widen its own threshold by it."""
        if not math.isfinite(ref_error):
            return self.atol
        if scale is not None and math.isfinite(scale):
            ref_error = min(ref_error, max(self.ref_cap * scale, 100 * self.atol))
        return max(self.atol, self.fudge * ref_error)


#: The one tolerance table, keyed by (dtype, device type). fp32 on CUDA assumes TF32 is off (the
#: checks switch it off and record the policy); bf16 means ``torch.autocast(bfloat16)``.
TOLERANCES: dict[tuple[str, str], Tolerance] = {
    ("fp32", "cpu"): Tolerance(1e-5, 5.0, "torch.testing default atol for float32; fudge 5 as in PyTorch "
                              "test_transformers; reference error capped at 1e-3 x max|value|", 1e-3),
    ("fp32", "cuda"): Tolerance(1e-5, 5.0, "as fp32/cpu; TF32 switched off for matmul and cuDNN during the checks",
                                1e-3),
    ("bf16", "cpu"): Tolerance(1e-3, 5.0, "torch.autocast(bfloat16); PyTorch default_atol[bfloat16]; reference "
                              "error capped at 0.1 x max|value|", 0.1),
    ("bf16", "cuda"): Tolerance(1e-3, 5.0, "torch.autocast(bfloat16); PyTorch default_atol[bfloat16]", 0.1),
}


def get_tolerance(dtype: str, device: str) -> Tolerance:
    """The :data:`TOLERANCES` entry for ``dtype`` (fp32, bf16) on ``device`` (cpu, cuda, cuda:N).

    Raises:
        ConfigError: no entry for that pair.
    """
    key = (dtype, device.split(":")[0])
    if key not in TOLERANCES:
        known = ", ".join(f"{d}/{dev}" for d, dev in TOLERANCES)
        raise ConfigError(f"no check tolerance for dtype {dtype!r} on {device!r}; known: {known}")
    return TOLERANCES[key]


# --------------------------------------------------------------------------- expectations

#: Extra equivalence groups on top of the registrations' declarations: none. Kept so that callers
#: of ``merge_groups(extra)`` get only what they pass (the declarations come from the registry).
DEFAULT_EQUIVALENT: dict[str, tuple[frozenset[str], ...]] = {}


def registry_groups(registry: Registry, extra: dict[str, Iterable[Iterable[str]]] | None = None,
                    cfg: ModelConfig | None = None) -> dict[str, tuple[frozenset[str], ...]]:
    """The components' declared equivalence groups (:func:`harness.contracts.declared_groups`) plus
    ``extra`` (e.g. from ``--equivalent``)."""
    from .contracts import declared_groups

    return merge_groups(extra, declared_groups(registry, cfg))


def held_to_reference(registry: Registry, slot: str, name: str, groups) -> bool:
    """Whether component ``name`` is expected to compute its slot's reference: it declares nothing
    (or is ``equivalent_to`` such a component), or ``groups`` put it with one that does."""
    from .contracts import reference_key

    if reference_key(registry, slot, name).startswith("reference"):
        return True
    return any(same_function(slot, name, other, groups) and reference_key(registry, slot, other) == "reference"
               for (s, other) in registry.components if s == slot and other != name)


def merge_groups(extra: dict[str, Iterable[Iterable[str]]] | None,
                 base: dict[str, tuple[frozenset[str], ...]] | None = None) -> dict[str, tuple[frozenset[str], ...]]:
    """``base`` (default :data:`DEFAULT_EQUIVALENT`) plus ``extra`` groups; groups sharing a
    component are merged. Raises ConfigError on a slot that does not exist."""
    out = {slot: [set(g) for g in groups] for slot, groups in (DEFAULT_EQUIVALENT if base is None else base).items()}
    for slot, groups in (extra or {}).items():
        if slot not in SLOTS:
            raise ConfigError(f"--equivalent: unknown slot {slot!r}; slots: {', '.join(SLOTS)}")
        for g in groups:
            new = set(g)
            keep = []
            for old in out.get(slot, []):
                if old & new:
                    new |= old
                else:
                    keep.append(old)
            out[slot] = keep + [new]
    return {slot: tuple(frozenset(g) for g in groups) for slot, groups in out.items()}


def parse_equivalent(items: Iterable[str]) -> dict[str, list[set[str]]]:
    """``["attention=annotated,my_attn"]`` -> ``{"attention": [{"annotated", "my_attn"}]}``.

    Raises:
        ConfigError: an item that is not ``SLOT=A,B[,...]`` with at least two components.
    """
    out: dict[str, list[set[str]]] = {}
    for item in items:
        slot, sep, comps = item.partition("=")
        names = {c.strip() for c in comps.split(",") if c.strip()}
        if not sep or len(names) < 2:
            raise ConfigError(f"--equivalent expects SLOT=A,B (e.g. attention=annotated,my_attn), got {item!r}")
        out.setdefault(slot.strip(), []).append(names)
    return out


def same_function(slot: str, x: str, y: str, groups=None) -> bool:
    """True when components ``x`` and ``y`` of ``slot`` are equal or declared equivalent."""
    groups = DEFAULT_EQUIVALENT if groups is None else groups
    return x == y or any(x in g and y in g for g in groups.get(slot, ()))


def expected_relation(a: Variant, b: Variant, groups=None) -> tuple[str, list[str]]:
    """What a pair should show, from the slots alone.

    Returns:
        ``("equivalent", [])`` when every slot holds the same or a declared-equivalent component,
        else ``("differs", ["norm: post vs pre", ...])`` listing the slots that differ.
    """
    ra, rb = a.resolved(), b.resolved()
    diffs = [f"{slot}: {ra[slot]} vs {rb[slot]}" for slot in SLOTS
             if not same_function(slot, ra[slot], rb[slot], groups)]
    return ("differs" if diffs else "equivalent"), diffs


# --------------------------------------------------------------------------- inputs and state

#: The model the checks build by default: small enough that ``check --variants all`` takes
#: seconds on a 2-core CPU; dropout > 0 so the train-mode probes run with dropout active.
CHECK_MODEL = ModelConfig(N=2, d_model=32, h=4, d_ff=64, dropout=0.1, vocab=11, pad=0, max_len=32)


def padded_batch(cfg: ModelConfig, batch: int = 4, src_len: int = 9, tgt_len: int = 10,
                 seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A batch with real right padding: row i ends with min(i, L - 2) pad tokens in both source and target.

    Tokens are drawn uniformly from the non-pad ids. ``src_len != tgt_len`` on purpose, so a
    component that confuses the two lengths fails.

    Returns:
        ``(src (B, S), tgt (B, T), labels (B, T))`` int64 on the CPU; labels are random non-pad ids.

    Raises:
        ConfigError: lengths beyond ``cfg.max_len`` or fewer than 2 tokens.
    """
    if not 2 <= src_len <= cfg.max_len or not 2 <= tgt_len <= cfg.max_len:
        raise ConfigError(f"check batch lengths must be in [2, max_len={cfg.max_len}], got S={src_len}, T={tgt_len}")
    g = torch.Generator().manual_seed(seed)
    src = _non_pad((batch, src_len), cfg, g)
    tgt = _non_pad((batch, tgt_len), cfg, g)
    labels = _non_pad((batch, tgt_len), cfg, g)
    for i in range(batch):
        src[i, src_len - min(i, src_len - 2):] = cfg.pad
        tgt[i, tgt_len - min(i, tgt_len - 2):] = cfg.pad
    return src, tgt, labels


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


def reference_state(registry: Registry, variants: Iterable[Variant], cfg: ModelConfig,
                    seed: int = 0) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """One canonical state covering every canonical name of ``variants``.

    Returns:
        ``(state, errors)``: the state (:func:`draw_reference_state` over the union of names)
        and ``{variant: crash reason}`` for variants that could not even be built.

    Raises:
        HarnessError: two variants use one canonical name with different shapes (a component
            that does not follow its slot's canonical layout).
    """
    shapes: dict[str, tuple[int, ...]] = {}
    owner: dict[str, str] = {}
    errors: dict[str, str] = {}
    for v in variants:
        try:
            model = build_model(registry, v, cfg, seed)
        except HarnessError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported per variant
            errors[v.name] = describe_exception(exc)
            continue
        for name, t in canonical_state_dict(model).items():
            if name in shapes and shapes[name] != tuple(t.shape):
                raise HarnessError(f"canonical parameter {name!r} has shape {shapes[name]} in variant "
                                   f"{owner[name]!r} but {tuple(t.shape)} in {v.name!r}; a component does not "
                                   f"follow its slot's canonical layout (see harness/model.py)")
            shapes.setdefault(name, tuple(t.shape))
            owner.setdefault(name, v.name)
    return draw_reference_state(shapes, seed), errors


def load_variant(registry: Registry, variant: Variant, cfg: ModelConfig, state: dict[str, torch.Tensor],
                 seed: int = 0) -> tuple[nn.Module, list[str]]:
    """Build ``variant`` and load ``state`` through the canonical layout. Returns (model, lossy-load notes)."""
    model = build_model(registry, variant, cfg, seed)
    return model, load_canonical_state_dict(model, state)


def describe_exception(exc: BaseException) -> str:
    """``"RuntimeError: <first line> (at variants/bugs.py:79 in forward -> variants/attention.py:186 in split)"``:
    the two innermost frames outside torch and outside this module, caller first."""
    msg = str(exc).strip().splitlines()[0][:240] if str(exc).strip() else ""
    skip = (os.path.dirname(torch.__file__), os.path.abspath(__file__))
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(skip)]
    where = []
    for f in frames[-2:]:
        path = f.filename
        with contextlib.suppress(ValueError):
            rel = os.path.relpath(path)
            path = rel if not rel.startswith("..") else path
        where.append(f"{path}:{f.lineno} in {f.name}")
    return f"{type(exc).__name__}: {msg}" + (f" (at {' -> '.join(where)})" if where else "")


# --------------------------------------------------------------------------- running

@contextlib.contextmanager
def tf32_disabled():
    """Switch TF32 off for CUDA matmul and cuDNN inside the block; yields the policy as text."""
    if not torch.cuda.is_available():
        yield "n/a (no CUDA)"
        return
    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield f"off during checks (allow_tf32 was matmul={old[0]}, cudnn={old[1]}; restored afterwards)"
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def canonical_grads(model: nn.Module) -> dict[str, torch.Tensor]:
    """Gradient of every canonical parameter (tied names share one gradient); CPU copies."""
    out = {}
    for name, t in canonical_state_dict(model).items():
        if isinstance(t, nn.Parameter) and t.grad is not None:
            out[name] = t.grad.detach().cpu().clone()
    return out


def forward_backward(model: nn.Module, src, tgt, labels, device: torch.device, dtype: str,
                     pad: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Eval-mode logits (B, T, V) and canonical gradients of the mean cross-entropy at real target positions.

    ``dtype``: ``fp32``, ``bf16`` (autocast) or ``fp64`` (the model must already be float64).
    Returns CPU tensors.
    """
    model.eval()
    model.zero_grad(set_to_none=True)
    src, tgt, labels = src.to(device), tgt.to(device), labels.to(device)
    keep = tgt != pad
    with _autocast(device, dtype):
        logits = model(src, tgt)
    work = torch.float64 if dtype == "fp64" else torch.float32
    loss = F.cross_entropy(logits[keep].to(work), labels[keep])
    loss.backward()
    return logits.detach().cpu(), canonical_grads(model)


@dataclass
class VariantRun:
    """One variant's logits (B, T, V) and canonical gradients, in the run dtype and in float64."""

    variant: str
    logits: torch.Tensor | None = None
    grads: dict[str, torch.Tensor] = field(default_factory=dict)
    logits64: torch.Tensor | None = None
    grads64: dict[str, torch.Tensor] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    error: str = ""


def run_variant(registry: Registry, variant: Variant, cfg: ModelConfig, state: dict[str, torch.Tensor],
                batch, device: torch.device | str = "cpu", dtype: str = "fp32") -> VariantRun:
    """Run ``variant`` holding ``state`` on ``batch`` in ``dtype`` and in float64 (golden); never raises
    for a failing variant (its ``error`` says why)."""
    device = torch.device(device)
    run = VariantRun(variant.name)
    src, tgt, labels = batch
    try:
        model, run.notes = load_variant(registry, variant, cfg, state)
        run.logits, run.grads = forward_backward(model.to(device), src, tgt, labels, device, dtype, cfg.pad)
        model64, _ = load_variant(registry, variant, cfg, state)
        model64 = model64.to(device=device, dtype=torch.float64)
        run.logits64, run.grads64 = forward_backward(model64, src, tgt, labels, device, "fp64", cfg.pad)
    except Exception as exc:  # noqa: BLE001 - a crash is a check result
        run.error = describe_exception(exc)
    return run


# --------------------------------------------------------------------------- comparing

@dataclass
class TensorDiff:
    """One compared tensor: max |A - B| against ``max(atol, fudge * ref_error)``.

    ``ref_error`` is max(|A - A64|, |B - B64|); ``golden`` is |A64 - B64| (the difference that
    remains without rounding). Values are in the tensor's unit (logits: nats; gradients: per unit).
    """

    name: str
    max_abs: float
    ref_error: float
    threshold: float
    golden: float
    bitwise: bool

    @property
    def within(self) -> bool:
        return self.max_abs <= self.threshold

    @property
    def ratio(self) -> float:
        return self.max_abs / self.threshold if self.threshold > 0 else math.inf


def _maxabs(x: torch.Tensor, y: torch.Tensor) -> float:
    """max |x - y| in float64; inf when NaNs sit at different places, NaN-NaN pairs count as equal."""
    if x.shape != y.shape:
        return math.inf
    nx, ny = torch.isnan(x), torch.isnan(y)
    if not torch.equal(nx, ny):
        return math.inf
    d = (x - y).abs().masked_fill(nx, 0.0)
    d = torch.nan_to_num(d, nan=math.inf)  # inf - inf
    return float(d.max()) if d.numel() else 0.0


def tensor_diff(name: str, a, b, a64, b64, tol: Tolerance, keep: torch.Tensor | None = None) -> TensorDiff:
    """Compare ``a`` with ``b`` (optionally only where ``keep`` (leading dims) is True)."""
    ts = [t.detach().cpu() for t in (a, b, a64, b64)]
    if keep is not None:
        k = keep.cpu()
        ts = [t[k] for t in ts]
    bitwise = ts[0].dtype == ts[1].dtype and torch.equal(ts[0], ts[1])
    a, b, a64, b64 = (t.to(torch.float64) for t in ts)
    ref = max(_maxabs(a, a64), _maxabs(b, b64))
    scale = max((float(t.abs().max()) for t in (a64, b64) if t.numel() and torch.isfinite(t).all()), default=None)
    return TensorDiff(name, 0.0 if bitwise else _maxabs(a, b), ref, tol.threshold(ref, scale), _maxabs(a64, b64),
                      bitwise)


IDENTICAL = "identical"
EQUIVALENT = "equivalent"
DECLARED = "differs as declared"
UNEXPECTED = "differs unexpectedly"
UNEXPECTED_SAME = "no difference (declared different)"
CRASHES = "crashes"
NOT_COMPARABLE = "not comparable"


def _verdict(diffs: list[TensorDiff], expected: str) -> tuple[str, bool]:
    within = all(d.within for d in diffs)
    if expected == "equivalent":
        if within:
            return (IDENTICAL if all(d.bitwise for d in diffs) else EQUIVALENT), True
        return UNEXPECTED, False
    return (UNEXPECTED_SAME, True) if within else (DECLARED, True)


@dataclass
class PairResult:
    """A vs B: what the slots declare, what was measured, the verdict."""

    a: str
    b: str
    expected: str
    declared: list[str]
    verdict: str
    ok: bool
    logits: TensorDiff | None = None
    grad_max: TensorDiff | None = None      # the gradient with the largest max |Δ|
    grad_worst: TensorDiff | None = None    # the gradient closest to (or furthest over) its threshold
    grads_compared: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def diffs(self) -> list[TensorDiff]:
        return [d for d in (self.logits, self.grad_max, self.grad_worst) if d is not None]

    @property
    def binding(self) -> TensorDiff | None:
        """The compared tensor with the largest max|Δ| / threshold."""
        return max(self.diffs, key=lambda d: d.ratio, default=None)

    def cell(self) -> str:
        """Short text for the equivalence matrix."""
        size = max((d.max_abs for d in self.diffs), default=None)
        return {IDENTICAL: "identical", EQUIVALENT: f"≈ {_fmt(size)}",
                DECLARED: f"≠ {_fmt(self.logits.max_abs if self.logits else None)}",
                UNEXPECTED: f"FAIL ≠ {_fmt(size)}", UNEXPECTED_SAME: "FAIL no diff",
                CRASHES: "FAIL crash"}.get(self.verdict, self.verdict)

    def explain(self) -> str:
        """One paragraph a reader understands (used in assertion messages)."""
        parts = [f"{self.a} vs {self.b}: {self.verdict} (expected {self.expected}"
                 + (f": {'; '.join(self.declared)}" if self.declared else "") + ")"]
        if self.logits:
            parts.append(f"max|Δ logits| {_fmt(self.logits.max_abs)} (threshold {_fmt(self.logits.threshold)}, "
                         f"float64 runs differ by {_fmt(self.logits.golden)})")
        if self.grad_max:
            parts.append(f"max|Δ grad| {_fmt(self.grad_max.max_abs)} in {self.grad_max.name} "
                         f"(threshold {_fmt(self.grad_max.threshold)})")
        if self.grad_worst and self.grad_worst is not self.grad_max and not self.grad_worst.within:
            parts.append(f"over threshold: {self.grad_worst.name} {_fmt(self.grad_worst.max_abs)} > "
                         f"{_fmt(self.grad_worst.threshold)}")
        parts += self.notes
        return "; ".join(parts)


def layout_relation(ra: "VariantRun", rb: "VariantRun", expected: str, declared: list[str]) -> tuple[str, list[str]]:
    """A pair declared equivalent by its slots whose variants cannot hold the same parameters (a lossy
    load of the reference state, or canonical parameters only one of them has: a tied embedding, a
    bias-free projection) is a declared difference of parameter layout."""
    if expected != "equivalent" or ra.error or rb.error:
        return expected, declared
    layout = [f"{r.variant}: {n}" for r in (ra, rb) for n in r.notes[:2]]
    only = sorted(set(ra.grads) ^ set(rb.grads))
    if only:
        layout.append(f"canonical parameters in one variant only ({', '.join(only[:2])}{', ...' if len(only) > 2 else ''})")
    if not layout:
        return expected, declared
    return "differs", declared + ["parameter layout: " + "; ".join(layout)]


def compare_runs(ra: VariantRun, rb: VariantRun, expected: str, declared: list[str], tol: Tolerance,
                 keep: torch.Tensor) -> PairResult:
    """Compare two :class:`VariantRun` s: logits at ``keep`` (B, T) positions and every shared canonical gradient."""
    if ra.error or rb.error:
        notes = [f"{r.variant} crashes: {r.error}" for r in (ra, rb) if r.error]
        return PairResult(ra.variant, rb.variant, expected, declared, CRASHES, False, notes=notes)
    logits = tensor_diff("logits", ra.logits, rb.logits, ra.logits64, rb.logits64, tol, keep)
    common = sorted(set(ra.grads) & set(rb.grads))
    grads = [tensor_diff(n, ra.grads[n], rb.grads[n], ra.grads64[n], rb.grads64[n], tol) for n in common]
    notes = []
    for x, y in ((ra, rb), (rb, ra)):
        only = sorted(set(x.grads) - set(y.grads))
        if only:
            notes.append(f"{len(only)} canonical parameter(s) only in {x.variant} "
                         f"({', '.join(only[:3])}{', ...' if len(only) > 3 else ''})")
    verdict, ok = _verdict([logits, *grads], expected)
    return PairResult(ra.variant, rb.variant, expected, declared, verdict, ok, logits,
                      max(grads, key=lambda d: d.max_abs, default=None),
                      max(grads, key=lambda d: d.ratio, default=None), len(grads), notes)


def compare_variants(registry: Registry, a: str | Variant, b: str | Variant, cfg: ModelConfig | None = None, *,
                     device: str = "cpu", dtype: str = "fp32", seed: int = 0, groups=None,
                     expected: str | None = None) -> PairResult:
    """Copy A's canonical parameters into B, run both (and their float64 runs) on one padded batch, compare.

    Args:
        expected: ``"equivalent"`` / ``"differs"``; default: :func:`expected_relation` from the slots.

    Raises:
        UnknownNameError: an unknown variant name.  ConfigError: bad ``cfg``, dtype or device.
    """
    cfg = (cfg or CHECK_MODEL).validate()
    va, vb = (registry.select([x])[0] if isinstance(x, str) else x for x in (a, b))
    tol = get_tolerance(dtype, device)
    groups = registry_groups(registry, None, cfg) if groups is None else groups
    rel, declared = expected_relation(va, vb, groups)
    batch = padded_batch(cfg, seed=seed)
    with tf32_disabled():
        state, _ = reference_state(registry, [va, vb], cfg, seed)
        ra, rb = (run_variant(registry, v, cfg, state, batch, device, dtype) for v in (va, vb))
    if expected is None:
        rel, declared = layout_relation(ra, rb, rel, declared)
    return compare_runs(ra, rb, expected or rel, declared, tol, batch[1] != cfg.pad)


# --------------------------------------------------------------------------- mask probes

from .probes import (ProbeResult, probe_causal, probe_extra_padding, probe_finite,  # noqa: E402,F401
                     probe_masked_keys)


@dataclass
class MaskComponentResult:
    """A mask component on its own: does softmax(apply(scores, mask)) match the reference masked softmax?"""

    component: str
    buggy: bool
    padding_ok: bool
    causal_ok: bool
    max_error: float
    fully_masked_row: str
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.padding_ok and self.causal_ok


def probe_mask_component(registry: Registry, name: str, cfg: ModelConfig, batch=None, seed: int = 0) -> MaskComponentResult:
    """Mask component ``name`` on its own (:func:`harness.contracts.check_mask`): softmax(apply(scores, mask))
    against the reference masked softmax at real query rows, finite rows, and what a fully masked row
    (a source of pad tokens only) gives. ``batch`` is accepted for compatibility; the contract check
    uses its own two padded batches."""
    from .contracts import check_mask

    comp = registry.component("mask", name)
    return mask_result(comp.name, comp.buggy, check_mask(comp, cfg, seed))


def mask_result(name: str, buggy: bool, results) -> MaskComponentResult:
    """A :class:`MaskComponentResult` from the mask component's contract results
    (:func:`harness.contracts.check_mask`), without running them again."""
    res = {r.check.split(" ")[0]: r for r in results}
    padding, causal, finite, fully = res["padding"], res["causal"], res["finite"], res["fully"]
    reasons = [r.diagnosis or r.detail for r in (padding, causal, finite, fully) if not r.ok]
    got = fully.detail.split(",")[0].removeprefix("gives ").strip() if fully.detail else fully.verdict
    return MaskComponentResult(name, buggy, padding.ok and finite.ok and fully.ok, causal.ok,
                               max(x.max_abs or 0.0 for x in (padding, causal)), got, "; ".join(reasons))


# --------------------------------------------------------------------------- references from PyTorch

@dataclass
class ReferenceResult:
    """A component or stack against a PyTorch built-in (or against itself on another device)."""

    subject: str
    reference: str
    expected: str
    verdict: str
    ok: bool
    output: TensorDiff | None = None
    grad_max: TensorDiff | None = None
    grad_worst: TensorDiff | None = None
    padded_rows: float | None = None
    detail: str = ""
    buggy: bool = False

    @property
    def diffs(self) -> list[TensorDiff]:
        return [d for d in (self.output, self.grad_max, self.grad_worst) if d is not None]

    @property
    def binding(self) -> TensorDiff | None:
        return max(self.diffs, key=lambda d: d.ratio, default=None)

    def explain(self) -> str:
        parts = [f"{self.subject} vs {self.reference}: {self.verdict} (expected {self.expected})"]
        if self.output:
            parts.append(f"max|Δ output| {_fmt(self.output.max_abs)} (threshold {_fmt(self.output.threshold)})")
        if self.grad_max:
            parts.append(f"max|Δ grad| {_fmt(self.grad_max.max_abs)} in {self.grad_max.name} "
                         f"(threshold {_fmt(self.grad_max.threshold)})")
        if self.detail:
            parts.append(self.detail)
        return "; ".join(parts)


def _reference_verdict(subject, reference, expected, out: TensorDiff, grads: list[TensorDiff], buggy: bool,
                       padded: float | None = None, detail: str = "") -> ReferenceResult:
    verdict, ok = _verdict([out, *grads], expected)
    return ReferenceResult(subject, reference, expected, verdict, ok, out,
                           max(grads, key=lambda d: d.max_abs, default=None),
                           max(grads, key=lambda d: d.ratio, default=None), padded, detail, buggy)


def _resolved_components(registry: Registry, slots: dict[str, str]):
    return {slot: registry.component(slot, name) for slot, name in Variant("_check", slots).resolved().items()}


def _mha_state(attn_state: dict[str, torch.Tensor], has_bias: bool) -> dict[str, torch.Tensor]:
    out = {"in_proj_weight": torch.cat([attn_state[f"w_{x}.weight"] for x in "qkv"]),
           "out_proj.weight": attn_state["w_o.weight"]}
    if has_bias:
        out["in_proj_bias"] = torch.cat([attn_state[f"w_{x}.bias"] for x in "qkv"])
        out["out_proj.bias"] = attn_state["w_o.bias"]
    return out


def _mha_grads(mha: nn.MultiheadAttention, d: int) -> dict[str, torch.Tensor]:
    out = {"w_o.weight": mha.out_proj.weight.grad}
    for i, x in enumerate("qkv"):
        out[f"w_{x}.weight"] = mha.in_proj_weight.grad[i * d:(i + 1) * d]
        if mha.in_proj_bias is not None:
            out[f"w_{x}.bias"] = mha.in_proj_bias.grad[i * d:(i + 1) * d]
    if mha.out_proj.bias is not None:
        out["w_o.bias"] = mha.out_proj.bias.grad
    return {k: v.detach().cpu().clone() for k, v in out.items()}




def compare_attention_with_mha(registry: Registry, attention: str, mask: str = "bool", projections: str = "biased",
                               cfg: ModelConfig | None = None, *, device: torch.device | str = "cpu",
                               dtype: str = "fp32", seed: int = 0, groups=None,
                               expected: str | None = None) -> list[ReferenceResult]:
    """Attention component vs ``torch.nn.MultiheadAttention`` with mapped weights, for self-attention
    (causal + padding mask, T x T) and cross-attention (source padding mask, T x S).

    ``in_proj_weight`` = cat(w_q, w_k, w_v) (3D, D), ``out_proj`` = w_o. The reference masks are
    made from the token ids in MHA's convention (bool, True = blocked: ``attn_mask`` (T, T) causal,
    ``key_padding_mask`` (B, L)); the component gets its own mask component's masks. Output (B, T, D)
    is compared at real query rows (the ``valid_lens`` style is causal-only at padded rows; the max
    |Δ| there is reported as ``padded_rows``), gradients for every canonical weight and both inputs.
    """
    cfg = (cfg or CHECK_MODEL).validate()
    device = torch.device(device)
    tol = get_tolerance(dtype, device.type)
    comps = _resolved_components(registry, {"attention": attention, "mask": mask, "projections": projections})
    buggy = comps["attention"].buggy or comps["mask"].buggy
    subject = f"attention={attention}, mask={mask}, projections={projections}"
    groups = registry_groups(registry, None, cfg) if groups is None else groups
    expected = expected or ("equivalent" if buggy or (held_to_reference(registry, "attention", attention, groups)
                                                      and held_to_reference(registry, "mask", mask, groups))
                            else "differs")
    src, tgt, _ = padded_batch(cfg, seed=seed)
    b, s, t, d = src.size(0), src.size(1), tgt.size(1), cfg.d_model
    g = torch.Generator().manual_seed(seed + 53)
    x, mem, r = torch.randn(b, t, d, generator=g), torch.randn(b, s, d, generator=g), torch.randn(b, t, d, generator=g)
    real = tgt != cfg.pad
    results = []
    for kind in ("self", "cross"):
        reference = f"nn.MultiheadAttention ({kind}-attention)"
        try:
            runs = {}
            for prec in ("lp", "fp64"):
                runs[prec] = _attention_pair(comps, cfg, kind, prec, x, mem, r, src, tgt, device, dtype, seed)
        except _LayoutError as exc:
            results.append(ReferenceResult(subject, reference, expected, UNEXPECTED, False, detail=str(exc), buggy=buggy))
            continue
        except Exception as exc:  # noqa: BLE001
            results.append(ReferenceResult(subject, reference, expected, CRASHES, False,
                                           detail=f"crashes: {describe_exception(exc)}", buggy=buggy))
            continue
        (o, og, m, mg), (o64, og64, m64, mg64) = runs["lp"], runs["fp64"]
        out = tensor_diff("output", o, m, o64, m64, tol, real)
        padded = _maxabs(o[~real].double(), m[~real].double()) if (~real).any() else None
        grads = [tensor_diff(n, og[n], mg[n], og64[n], mg64[n], tol) for n in sorted(og)]
        results.append(_reference_verdict(subject, reference, expected, out, grads, buggy, padded))
    return results


class _LayoutError(Exception):
    pass


def _attention_pair(comps, cfg, kind, prec, x, mem, r, src, tgt, device, dtype, seed):
    """One precision of the MHA comparison: (ours out, ours grads, mha out, mha grads)."""
    wdtype = torch.float64 if prec == "fp64" else torch.float32
    run_dtype = "fp64" if prec == "fp64" else dtype
    ctx = BuildContext(cfg, comps)
    attn = ctx.make("attention")
    names = canonical_state_dict(attn)
    from .contracts import ATTENTION_LAYOUT

    missing = [n for n in ATTENTION_LAYOUT if n not in names]
    if missing:
        raise _LayoutError(f"attention component does not export the canonical layout (missing {', '.join(missing)}; "
                           f"has {', '.join(sorted(names)) or 'nothing'})")
    state = draw_reference_state({n: tuple(v.shape) for n, v in names.items()}, seed)
    load_canonical_state_dict(attn, state)
    has_bias = "w_q.bias" in state
    mha = nn.MultiheadAttention(cfg.d_model, cfg.h, dropout=0.0, bias=has_bias, batch_first=True)
    mha.load_state_dict(_mha_state(state, has_bias))
    attn, mha = attn.to(device, wdtype).eval(), mha.to(device, wdtype).eval()
    src, tgt = src.to(device), tgt.to(device)
    style = ctx.mask
    if kind == "self":
        ours_mask = style.tgt_mask(tgt, cfg.pad)
        ref_kw = {"attn_mask": ~torch.ones(tgt.size(1), tgt.size(1), dtype=torch.bool, device=device).tril(),
                  "key_padding_mask": tgt == cfg.pad}
    else:
        ours_mask = style.src_mask(src, cfg.pad)
        ref_kw = {"key_padding_mask": src == cfg.pad}
    keep = (tgt != cfg.pad)[..., None].to(wdtype)
    weight = r.to(device, wdtype) * keep
    outs = []
    for module in (attn, mha):
        q = x.detach().clone().to(device, wdtype).requires_grad_()
        kv = q if kind == "self" else mem.detach().clone().to(device, wdtype).requires_grad_()
        with _autocast(device, run_dtype):
            out = module(q, kv, kv, ours_mask) if module is attn else \
                module(q, kv, kv, need_weights=False, **ref_kw)[0]
        (out.to(wdtype) * weight).sum().backward()
        grads = canonical_grads(attn) if module is attn else _mha_grads(mha, cfg.d_model)
        grads["input query"] = q.grad.detach().cpu().clone()
        if kind == "cross":
            grads["input memory"] = kv.grad.detach().cpu().clone()
        outs += [out.detach().cpu(), grads]
    return outs


_TORCH_NAME_PATTERNS = [
    (re.compile(r"(self_attn|src_attn)\.w_([qkv])\.(weight|bias)"),
     lambda m: (f"{'self_attn' if m[1] == 'self_attn' else 'multihead_attn'}.in_proj_{m[3]}", "qkv".index(m[2]))),
    (re.compile(r"(self_attn|src_attn)\.w_o\.(weight|bias)"),
     lambda m: (f"{'self_attn' if m[1] == 'self_attn' else 'multihead_attn'}.out_proj.{m[2]}", None)),
    (re.compile(r"feed_forward\.w_([12])\.(weight|bias)"), lambda m: (f"linear{m[1]}.{m[2]}", None)),
    (re.compile(r"sublayer\.(\d)\.norm\.(weight|bias)"), lambda m: (f"norm{int(m[1]) + 1}.{m[2]}", None)),
]


def nn_transformer_name(name: str) -> tuple[str, int | None]:
    """Canonical stack parameter -> (``nn.Transformer`` parameter, block of ``in_proj`` or None).

    ``encoder.layers.0.self_attn.w_k.weight`` -> (``encoder.layers.0.self_attn.in_proj_weight``, 1);
    ``decoder.layers.1.sublayer.2.norm.bias`` -> (``decoder.layers.1.norm3.bias``, None).

    Raises:
        KeyError: no counterpart in ``nn.Transformer``.
    """
    if re.fullmatch(r"(encoder|decoder)\.norm\.(weight|bias)", name):
        return name, None
    m = re.fullmatch(r"(encoder|decoder)\.layers\.(\d+)\.(.+)", name)
    if m:
        for pat, fn in _TORCH_NAME_PATTERNS:
            mm = pat.fullmatch(m[3])
            if mm:
                tname, block = fn(mm)
                return f"{m[1]}.layers.{m[2]}.{tname}", block
    raise KeyError(f"no nn.Transformer counterpart for canonical parameter {name!r}")


def make_nn_transformer(cfg: ModelConfig, norm_first: bool, final_norm: bool = True, bias: bool = True) -> nn.Transformer:
    """``nn.Transformer`` with the check config, batch_first; ``final_norm=False`` builds it with
    ``custom_encoder``/``custom_decoder`` whose ``norm=None`` (no LayerNorm after the stacks);
    ``bias=False`` drops the biases of every Linear and LayerNorm (PyTorch's ``bias`` argument)."""
    d, h, n, ff, p = cfg.d_model, cfg.h, cfg.N, cfg.d_ff, cfg.dropout
    kw = dict(batch_first=True, norm_first=norm_first, bias=bias)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # enable_nested_tensor warning for norm_first=True
        if final_norm:
            return nn.Transformer(d, h, n, n, ff, p, **kw)
        enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(d, h, ff, p, **kw), n, norm=None,
                                    enable_nested_tensor=False)
        dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(d, h, ff, p, **kw), n, norm=None)
        return nn.Transformer(d, h, n, n, ff, p, custom_encoder=enc, custom_decoder=dec, **kw)


_STACK_LN_BIAS = re.compile(r"(encoder|decoder)\.(.+\.)?norm\.bias")


def nn_transformer_structure(variant: Variant, groups=None, registry: Registry | None = None,
                             bias: bool | None = None) -> list[tuple[str, bool, bool, bool, str]]:
    """How ``variant``'s encoder-decoder stack relates to ``nn.Transformer``.

    Returns:
        rows ``(reference label, norm_first, final_norm, bias, reason)``; ``reason`` is empty when the
        structures match and the comparison can run, else it says why it cannot. ``projections=bias_free``
        is compared with ``nn.Transformer(bias=False)``, which has no LayerNorm biases either: the
        variant's LayerNorm biases are held at 0 for that comparison (their gradients are not compared).
    """
    from .contracts import reference_key

    registry = registry or Registry.from_plugins()
    groups = registry_groups(registry) if groups is None else groups
    r = variant.resolved()
    reasons = []
    norm_key = reference_key(registry, "norm", r["norm"])
    if norm_key not in ("reference:post", "reference:pre"):
        reasons.append(f"norm={r['norm']} declares a difference from post-norm and pre-norm (the only two "
                       f"nn.Transformer offers, norm_first)")
    if not held_to_reference(registry, "layer_norm", r["layer_norm"], groups):
        reasons.append(f"layer_norm={r['layer_norm']} declares a difference from nn.LayerNorm "
                       f"(biased variance, eps 1e-5 inside the square root)")
    if not held_to_reference(registry, "projections", r["projections"], groups):
        reasons.append(f"projections={r['projections']} declares a difference from nn.Linear")
    if not held_to_reference(registry, "attention", r["attention"], groups):
        reasons.append(f"attention={r['attention']} is not declared equivalent to nn.MultiheadAttention")
    if not held_to_reference(registry, "mask", r["mask"], groups):
        reasons.append(f"mask={r['mask']} is not declared equivalent to nn.Transformer's masks")
    first = norm_key == "reference:pre"
    bias = True if bias is None else bias
    label = f"nn.Transformer(norm_first={first}{'' if bias else ', bias=False'})"
    if reasons:
        return [(label, first, True, bias, "; ".join(reasons))]
    if first:
        return [(label, True, True, bias, "")]
    return [(label, False, True, bias,
             "nn.Transformer always appends a final LayerNorm after the encoder and after the decoder "
             "(encoder.norm, decoder.norm); post-norm has none, so the stock module computes a different function "
             "(compared below with norm=None instead)"),
            (f"{label}, encoder/decoder norm=None", False, False, bias, "")]


def compare_with_nn_transformer(registry: Registry, variant: Variant, cfg: ModelConfig,
                                state: dict[str, torch.Tensor], *, device: torch.device | str = "cpu",
                                dtype: str = "fp32", seed: int = 0, groups=None) -> list[ReferenceResult]:
    """``variant``'s encoder and decoder stacks vs ``nn.Transformer`` as far as the structures match.

    Both get the same embedded inputs (the variant's embedding + positional output, eval mode), masks
    from the ids (nn.Transformer: ``tgt_mask`` (T, T) True = blocked, ``*_key_padding_mask`` (B, L));
    decoder output (B, T, D) is compared at real target positions and the gradient of every canonical
    stack parameter against its mapped ``nn.Transformer`` gradient.
    """
    device = torch.device(device)
    tol = get_tolerance(dtype, device.type)
    out = []
    probe, _ = load_variant(registry, variant, cfg, state)
    has_bias = any(k.endswith("self_attn.w_q.bias") for k in canonical_state_dict(probe))
    for label, first, final, bias, reason in nn_transformer_structure(variant, groups, registry, has_bias):
        if reason:
            out.append(ReferenceResult(variant.name, label, NOT_COMPARABLE, NOT_COMPARABLE, True, detail=reason,
                                       buggy=variant.buggy))
            continue
        try:
            lp = _stack_pair(registry, variant, cfg, state, first, final, bias, device, dtype, seed)
            hp = _stack_pair(registry, variant, cfg, state, first, final, bias, device, "fp64", seed)
        except Exception as exc:  # noqa: BLE001
            out.append(ReferenceResult(variant.name, label, "equivalent", CRASHES, False,
                                       detail=f"crashes: {describe_exception(exc)}", buggy=variant.buggy))
            continue
        keep = padded_batch(cfg, seed=seed)[1] != cfg.pad
        o = tensor_diff("decoder output", lp[0], lp[2], hp[0], hp[2], tol, keep)
        grads = [tensor_diff(n, lp[1][n], lp[3][n], hp[1][n], hp[3][n], tol) for n in sorted(lp[1])]
        note = "" if bias else ("LayerNorm biases held at 0 (nn.Transformer(bias=False) has none); "
                                "their gradients not compared")
        out.append(_reference_verdict(variant.name, label, "equivalent", o, grads, variant.buggy, detail=note))
    return out


def _stack_pair(registry, variant, cfg, state, norm_first, final_norm, bias, device, dtype, seed):
    wdtype = torch.float64 if dtype == "fp64" else torch.float32
    if not bias:
        state = {k: (torch.zeros_like(v) if _STACK_LN_BIAS.fullmatch(k) else v) for k, v in state.items()}
    model, _ = load_variant(registry, variant, cfg, state)
    model = model.to(device, wdtype).eval()
    canon = {k: v for k, v in canonical_state_dict(model).items()
             if k.startswith(("encoder.", "decoder.")) and (bias or not _STACK_LN_BIAS.fullmatch(k))}
    ref = make_nn_transformer(cfg, norm_first, final_norm, bias)
    blocks: dict[str, dict[int, torch.Tensor]] = {}
    tstate = {}
    for name, t in canon.items():
        tname, block = nn_transformer_name(name)
        if block is None:
            tstate[tname] = t.detach()
        else:
            blocks.setdefault(tname, {})[block] = t.detach()
    tstate.update({k: torch.cat([v[i] for i in range(3)]) for k, v in blocks.items()})
    ref.load_state_dict(tstate, strict=True)
    ref = ref.to(device, wdtype).eval()
    src, tgt, _ = padded_batch(cfg, seed=seed)
    src, tgt = src.to(device), tgt.to(device)
    with torch.no_grad():
        x_src = model.src_pos(model.embed.src(src))
        x_tgt = model.tgt_pos(model.embed.tgt(tgt))
    r = torch.randn(*tgt.shape, cfg.d_model, generator=torch.Generator().manual_seed(seed + 61))
    weight = r.to(device, wdtype) * (tgt != cfg.pad)[..., None].to(wdtype)
    src_mask, tgt_mask = model.make_masks(src, tgt)
    with _autocast(device, dtype):
        ours = model.decoder(x_tgt, model.encoder(x_src, src_mask), src_mask, tgt_mask)
    (ours.to(wdtype) * weight).sum().backward()
    ours_grads = canonical_grads(model)
    ours_grads = {k: v for k, v in ours_grads.items() if k in canon}
    causal_block = ~torch.ones(tgt.size(1), tgt.size(1), dtype=torch.bool, device=device).tril()
    with _autocast(device, dtype), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = ref(x_src, x_tgt, tgt_mask=causal_block, src_key_padding_mask=src == cfg.pad,
                     tgt_key_padding_mask=tgt == cfg.pad, memory_key_padding_mask=src == cfg.pad)
    (theirs.to(wdtype) * weight).sum().backward()
    params = dict(ref.named_parameters())
    d = cfg.d_model
    their_grads = {}
    for name in ours_grads:
        tname, block = nn_transformer_name(name)
        gr = params[tname].grad
        their_grads[name] = (gr if block is None else gr[block * d:(block + 1) * d]).detach().cpu().clone()
    return ours.detach().cpu(), ours_grads, theirs.detach().cpu(), their_grads


# --------------------------------------------------------------------------- tied embeddings

@dataclass
class TieResult:
    """Tied canonical parameters of one variant and whether the ties survive ``.to`` and ``load_state_dict``."""

    variant: str
    groups: list[list[str]]
    params_unique: int
    params_per_use: int
    passed: bool
    detail: str = ""
    untied_logits: float | None = None
    untied_grad: float | None = None


def tie_groups(model: nn.Module) -> list[list[str]]:
    """Canonical names that share one parameter storage (each group sorted, length >= 2)."""
    by_storage: dict[tuple, list[str]] = {}
    for name, t in canonical_state_dict(model).items():
        if isinstance(t, nn.Parameter):
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()))
            by_storage.setdefault(key, []).append(name)
    return sorted(sorted(v) for v in by_storage.values() if len(v) > 1)


def check_ties(registry: Registry, variant: Variant, cfg: ModelConfig, state: dict[str, torch.Tensor], *,
               device: torch.device | str = "cpu", tol: Tolerance | None = None, seed: int = 0) -> TieResult:
    """Ties after construction, after ``.to(device, float64)`` and after ``load_state_dict`` into a
    fresh model; unique vs per-use parameter counts. For a tied embedding (embedding component other
    than ``separate``) also: the same variant with ``embedding=separate`` holding the tied matrix in
    all three uses computes the same logits, and the tied gradient equals the sum of the untied ones.
    """
    device = torch.device(device)
    tol = tol or get_tolerance("fp32", device.type)
    model, _ = load_variant(registry, variant, cfg, state)
    built = tie_groups(model)
    canon = canonical_state_dict(model)
    per_use = sum(t.numel() for t in canon.values() if isinstance(t, nn.Parameter))
    unique = unique_parameter_count(model)
    problems = []
    moved = tie_groups(model.to(device=device, dtype=torch.float64))
    if moved != built:
        problems.append(f"ties changed after .to({device.type}, float64): {built} -> {moved}")
    model = model.to(device="cpu", dtype=torch.float32)
    fresh = build_model(registry, variant, cfg, seed + 1)
    try:
        fresh.load_state_dict(model.state_dict())
        loaded = tie_groups(fresh)
        if loaded != built:
            problems.append(f"ties changed after load_state_dict: {built} -> {loaded}")
        fresh_canon = canonical_state_dict(fresh)
        if any(not torch.equal(fresh_canon[k], v) for k, v in canonical_state_dict(model).items()):
            problems.append("load_state_dict did not restore every canonical parameter")
    except Exception as exc:  # noqa: BLE001
        problems.append(f"load_state_dict into a fresh model fails: {describe_exception(exc)}")
    res = TieResult(variant.name, built, unique, per_use, not problems, "; ".join(problems))
    untied = _untied_embedding(registry, variant, cfg, seed) if built else None
    if untied:
        try:
            _untied_counterpart(registry, variant, cfg, state, built, tol, res, untied)
        except Exception as exc:  # noqa: BLE001 - e.g. an embedding outside the canonical layout
            res.detail = "; ".join(filter(None, [res.detail, f"untied counterpart not compared: {describe_exception(exc)}"]))
    return res


def _untied_embedding(registry: Registry, variant: Variant, cfg: ModelConfig, seed: int) -> str | None:
    """An embedding component held to the slot's reference that ties nothing in ``variant`` (the untied
    counterpart of a tied embedding), or None."""
    from .contracts import reference_key

    own = variant.resolved()["embedding"]
    for (slot, name) in sorted(registry.components):
        if slot != "embedding" or name == own or reference_key(registry, slot, name) != "reference":
            continue
        try:
            if not tie_groups(build_model(registry, Variant("_untied", {**variant.slots, "embedding": name}), cfg, seed)):
                return name
        except Exception:  # noqa: BLE001 - not a usable counterpart
            continue
    return None


def _untied_counterpart(registry, variant, cfg, state, groups, tol, res: TieResult, embedding: str) -> None:
    untied_v = Variant(f"{variant.name}+{embedding}", {**variant.slots, "embedding": embedding})
    tied, _ = load_variant(registry, variant, cfg, state)
    untied, _ = load_variant(registry, untied_v, cfg, state)
    load_canonical_state_dict(untied, {k: v.detach().clone() for k, v in canonical_state_dict(tied).items()})
    src, tgt, labels = padded_batch(cfg)
    keep = tgt != cfg.pad
    cpu = torch.device("cpu")
    lt, gt = forward_backward(tied, src, tgt, labels, cpu, "fp32", cfg.pad)
    lu, gu = forward_backward(untied, src, tgt, labels, cpu, "fp32", cfg.pad)
    res.untied_logits = _maxabs(lt[keep].double(), lu[keep].double())
    res.untied_grad = max(_maxabs(gt[grp[0]].double(), sum(gu[n].double() for n in grp)) for grp in groups)
    # fp32 runs of two implementations; hold both to the table's absolute floor scaled by the fudge factor
    limit = tol.threshold(tol.atol)
    if res.untied_logits > limit or res.untied_grad > limit:
        res.passed = False
        res.detail = "; ".join(filter(None, [res.detail, (
            f"untied counterpart holding the tied matrix differs: logits {_fmt(res.untied_logits)}, "
            f"tied grad vs sum of untied grads {_fmt(res.untied_grad)} (limit {_fmt(limit)})")]))


# --------------------------------------------------------------------------- the whole check

@dataclass
class BugResult:
    """A faithful-bug variant and the reasons the checks flag it (flagged = at least one reason)."""

    variant: str
    summary: str
    reasons: list[str]

    @property
    def flagged(self) -> bool:
        return bool(self.reasons)


@dataclass
class CheckReport:
    """Everything ``python -m harness check`` measured; :meth:`failures` decides the exit code."""

    variants: list[str]
    buggy: list[str]
    cfg: ModelConfig
    device: str
    dtype: str
    seed: int
    tolerance: Tolerance
    tf32: str
    runs: dict[str, VariantRun]
    pairs: list[PairResult]
    probes: list[ProbeResult]
    masks: list[MaskComponentResult]
    mha: list[ReferenceResult]
    transformer: list[ReferenceResult]
    ties: list[TieResult]
    devices: list[ReferenceResult]
    bugs: list[BugResult]
    wall_s: float = 0.0
    components: list = field(default_factory=list)  # harness.contracts.ComponentResult

    def failures(self) -> list[str]:
        """One line per result that does not match its declaration (empty: exit 0). Components that
        break their slot's contract come first: they name the fault."""
        out = [c.reason() for c in self.components if not c.ok and not c.buggy]
        bug_set = set(self.buggy)
        for name in self.variants:
            if self.runs[name].error:
                out.append(f"{name} crashes: {self.runs[name].error}")
        out += [p.explain() for p in self.pairs if not p.ok and p.verdict != CRASHES]
        out += [f"{p.subject}: {p.detail}" for p in self.probes if not p.passed and p.subject not in bug_set]
        out += [r.explain() for r in self.mha + self.transformer + self.devices if not r.ok and not r.buggy]
        out += [f"{t.variant}: tied parameters: {t.detail}" for t in self.ties if not t.passed]
        out += [f"{b.variant}: faithful-bug variant NOT flagged by any check" for b in self.bugs if not b.flagged]
        return out

    @property
    def ok(self) -> bool:
        return not self.failures()

    def classes(self) -> list[list[str]]:
        """Equivalence classes of the (non-buggy) variants: connected by identical/equivalent pairs."""
        parent = {v: v for v in self.variants}

        def find(x):
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for p in self.pairs:
            if p.verdict in (IDENTICAL, EQUIVALENT):
                parent[find(p.a)] = find(p.b)
        groups: dict[str, list[str]] = {}
        for v in self.variants:
            groups.setdefault(find(v), []).append(v)
        return sorted((sorted(g) for g in groups.values()), key=lambda g: (-len(g), g))


def _threshold_for(run: VariantRun, tol: Tolerance, keep) -> float:
    if run.logits is None:
        return tol.atol
    ref = _maxabs(run.logits[keep].double(), run.logits64[keep].double())
    return tol.threshold(ref)


def run_checks(registry: Registry, variants: list[Variant], cfg: ModelConfig | None = None, *,
               device: torch.device | str = "cpu", dtype: str = "fp32", seed: int = 0, groups=None,
               log: Callable[[str], None] | None = None, all_components: bool = False) -> CheckReport:
    """Run every check on ``variants`` (buggy ones are probed and must be flagged, never paired).

    Scope: the components the variants use (each held to its slot's reference on its own, and every
    attention x mask in use against ``nn.MultiheadAttention``); with ``all_components`` every
    registered component. Nothing outside the scope can change the result.

    Args:
        cfg: model config (default :data:`CHECK_MODEL`).
        device: where the comparisons run; the CPU-vs-CUDA comparison runs whenever CUDA exists.
        dtype: ``fp32`` or ``bf16`` (autocast).
        groups: declared-equivalent components (default: the registrations' declarations,
            :func:`registry_groups`).
        log: optional progress callback (one line per stage).

    Raises:
        ConfigError: bad config/dtype/device.  HarnessError: inconsistent canonical layouts.
    """
    from .contracts import check_components

    t0 = time.perf_counter()
    log = log or (lambda line: None)
    cfg = (cfg or CHECK_MODEL).validate()
    device = torch.device(device)
    tol = get_tolerance(dtype, device.type)
    groups = registry_groups(registry, None, cfg) if groups is None else groups
    clean = [v for v in variants if not v.buggy]
    buggy = [v for v in variants if v.buggy]
    batch = padded_batch(cfg, seed=seed)
    keep = batch[1] != cfg.pad
    keys = sorted(registry.components) if all_components else _used_components(variants)
    with tf32_disabled() as tf32:
        log(f"check: {len(keys)} component(s) against their slot's reference")
        components = check_components(registry, keys, cfg, seed)
        state, build_errors = reference_state(registry, variants, cfg, seed)
        log(f"check: {len(clean)} variant(s) + {len(buggy)} faithful-bug variant(s) on {device.type} {dtype}")
        runs = {}
        for v in variants:
            runs[v.name] = (VariantRun(v.name, error=build_errors[v.name]) if v.name in build_errors
                            else run_variant(registry, v, cfg, state, batch, device, dtype))
        pairs = []
        for a, b in itertools.combinations(clean, 2):
            rel, declared = layout_relation(runs[a.name], runs[b.name], *expected_relation(a, b, groups))
            pairs.append(compare_runs(runs[a.name], runs[b.name], rel, declared, tol, keep))
        log(f"check: {len(pairs)} pair(s) compared; probes")
        probes = _all_probes(registry, variants, runs, cfg, state, batch, tol, keep, device, dtype, seed)
        masks = [mask_result(m, registry.component("mask", m).buggy,
                             [c for c in components if (c.slot, c.name) == ("mask", m)])
                 for (slot, m) in keys if slot == "mask"]  # already measured by the contract check
        log("check: attention vs nn.MultiheadAttention, stacks vs nn.Transformer")
        mha = []
        for att, msk, proj in _attention_combos(registry, variants, keys):
            mha += compare_attention_with_mha(registry, att, msk, proj, cfg, device=device, dtype=dtype, seed=seed,
                                              groups=groups)
        transformer = []
        for v in variants:
            if v.name not in build_errors:
                transformer += compare_with_nn_transformer(registry, v, cfg, state, device=device, dtype=dtype,
                                                           seed=seed, groups=groups)
        log("check: tied embeddings, devices")
        ties = [check_ties(registry, v, cfg, state, device=device, tol=tol, seed=seed) for v in clean
                if not runs[v.name].error]
        devices = _device_checks(registry, clean, runs, cfg, state, batch, device, dtype, keep)
    shape = (batch[0].size(0), batch[0].size(1), batch[1].size(1))
    bugs = [_bug_reasons(v, runs[v.name], probes, masks, mha, transformer, shape, components) for v in buggy]
    return CheckReport([v.name for v in clean], [v.name for v in buggy], cfg, device.type, dtype, seed, tol, tf32,
                       runs, pairs, probes, masks, mha, transformer, ties, devices, bugs, time.perf_counter() - t0,
                       components)


def _used_components(variants) -> list[tuple[str, str]]:
    """Every (slot, component) the variants use, sorted."""
    return sorted({(slot, name) for v in variants for slot, name in v.resolved().items()})


def _all_probes(registry, variants, runs, cfg, state, batch, tol, keep, device, dtype, seed) -> list[ProbeResult]:
    out = []
    for v in variants:
        if not runs[v.name].error:
            out += _probe_model(registry, v, cfg, state, batch, _threshold_for(runs[v.name], tol, keep),
                                device, dtype, seed)
    return out


def _probe_model(registry, v, cfg, state, batch, thr, device, dtype, seed) -> list[ProbeResult]:
    from .probes import run_probes

    try:
        model, _ = load_variant(registry, v, cfg, state)
        return run_probes(model.to(device), batch, cfg, thr, device=device, dtype=dtype, seed=seed, name=v.name)
    except Exception as exc:  # noqa: BLE001
        return [ProbeResult(v.name, "probes", "-", False, math.inf, thr, f"crashes: {describe_exception(exc)}")]


def probe_variant(registry: Registry, variant: Variant, cfg: ModelConfig | None = None, *,
                  device: torch.device | str = "cpu", dtype: str = "fp32", seed: int = 0) -> list[ProbeResult]:
    """The model-level probes of :mod:`harness.probes` (finite gradients; causal leak and masked source
    keys in eval and train mode; extra source padding) on ``variant``.

    The threshold is the variant's own: ``max(atol, fudge * ref_error)`` of its logits. A variant that
    crashes gives one failed result whose detail is the crash.
    """
    cfg = (cfg or CHECK_MODEL).validate()
    device = torch.device(device)
    tol = get_tolerance(dtype, device.type)
    batch = padded_batch(cfg, seed=seed)
    with tf32_disabled():
        state, errors = reference_state(registry, [variant], cfg, seed)
        run = VariantRun(variant.name, error=errors[variant.name]) if errors else \
            run_variant(registry, variant, cfg, state, batch, device, dtype)
        if run.error:
            return [ProbeResult(variant.name, "forward/backward", "eval", False, math.inf, tol.atol,
                                f"crashes: {run.error}")]
        return _probe_model(registry, variant, cfg, state, batch, _threshold_for(run, tol, batch[1] != cfg.pad),
                            device, dtype, seed)


def bug_reasons(registry: Registry, variant: Variant, cfg: ModelConfig | None = None, *,
                device: torch.device | str = "cpu", dtype: str = "fp32", seed: int = 0) -> BugResult:
    """Every reason the checks give to flag ``variant``: its components against their slots'
    references, a crash, failed probes, its attention against ``nn.MultiheadAttention`` and its
    stacks against ``nn.Transformer``. Empty reasons: nothing flags it."""
    report = run_checks(registry, [dataclasses.replace(variant, buggy=True)], cfg, device=device, dtype=dtype,
                        seed=seed)
    return report.bugs[0]


def _attention_combos(registry: Registry, variants, keys) -> list[tuple[str, str, str]]:
    """Every attention x mask x projections component in ``keys`` (the scope: the components the
    variants use, or all), plus every (attention, mask, projections) a selected variant uses."""
    def names(slot):
        return sorted({n for s, n in keys if s == slot})

    combos = {(a, m, p) for a in names("attention") for m in names("mask") for p in names("projections")}
    combos |= {(r["attention"], r["mask"], r["projections"]) for r in (v.resolved() for v in variants)}
    return sorted(combos)


def _device_checks(registry, clean, runs, cfg, state, batch, device, dtype, keep) -> list[ReferenceResult]:
    if not torch.cuda.is_available():
        return [ReferenceResult(v.name, "cpu vs cuda", NOT_COMPARABLE, "no CUDA", True,
                                detail="torch.cuda.is_available() is False") for v in clean]
    other = torch.device("cpu") if device.type == "cuda" else torch.device("cuda")
    tol = get_tolerance(dtype, "cuda")
    out = []
    for v in clean:
        mine = runs[v.name]
        theirs = run_variant(registry, v, cfg, state, batch, other, dtype)
        res = compare_runs(mine, theirs, "equivalent", [], tol, keep)
        out.append(ReferenceResult(v.name, f"{device.type} vs {other.type}", "equivalent", res.verdict, res.ok,
                                   res.logits, res.grad_max, res.grad_worst, detail="; ".join(res.notes)))
    return out


def _bug_reasons(v: Variant, run: VariantRun, probes, masks, mha, transformer,
                 batch_shape: tuple[int, int, int], components=()) -> BugResult:
    reasons = []
    r = v.resolved()
    used = set(r.items())
    reasons += [c.reason() for c in components if not c.ok and (c.slot, c.name) in used]
    if run.error:
        reasons.append(f"crashes on the padded check batch (B={batch_shape[0]}, S={batch_shape[1]}, "
                       f"T={batch_shape[2]}): {run.error}")
    seen_probe = set()
    for p in probes:
        if p.subject == v.name and not p.passed and p.probe not in seen_probe:
            seen_probe.add(p.probe)
            reasons.append(p.detail)
    subject = f"attention={r['attention']}, mask={r['mask']}, projections={r['projections']}"
    for x in mha:
        if x.subject == subject and not x.ok:
            size, thr = (x.output.max_abs, x.output.threshold) if x.output else (None, None)
            what = x.detail if x.verdict == CRASHES else (
                f"output differs from the same weights and masks in nn.MultiheadAttention by "
                f"{_fmt(size)} (threshold {_fmt(thr)})")
            reasons.append(f"{x.reference}: {what}")
    for x in transformer:
        if x.subject == v.name and x.verdict in (UNEXPECTED, CRASHES):
            reasons.append(f"{x.reference}: {x.verdict}")
    unique = list(dict.fromkeys(reasons))
    return BugResult(v.name, v.summary, unique)


# --------------------------------------------------------------------------- rendering

LEGEND = ("identical: bitwise equal logits and gradients; ≈ x: equivalent, largest max|Δ| x within its threshold; "
          "≠ x: differs as declared (x = max|Δ logit| at real target positions); FAIL: does not match the "
          "declaration (see the pair table).")


def matrix_frame(report: CheckReport):
    """variant x variant table of :meth:`PairResult.cell` texts (pandas DataFrame)."""
    import pandas as pd

    cells = {(p.a, p.b): p.cell() for p in report.pairs}
    rows = []
    for a in report.variants:
        row = {"variant": a}
        for b in report.variants:
            row[b] = "—" if a == b else cells.get((a, b)) or cells.get((b, a), "")
        rows.append(row)
    return pd.DataFrame(rows)


def results_frame(report: CheckReport):
    """One row per check result (the ``checks.csv`` layout): section, subject, reference, expected,
    verdict, ok, sizes (max |Δ|, threshold, reference error, float64 difference) and detail."""
    import pandas as pd

    rows = []

    def add(section, subject, reference, expected, verdict, ok, main=None, grad=None, detail="", **extra):
        rows.append({"section": section, "subject": subject, "reference": reference, "expected": expected,
                     "verdict": verdict, "ok": ok,
                     "max_abs": main.max_abs if main else None, "threshold": main.threshold if main else None,
                     "ref_error": main.ref_error if main else None, "float64_diff": main.golden if main else None,
                     "grad_max_abs": grad.max_abs if grad else None, "grad_name": grad.name if grad else None,
                     "grad_threshold": grad.threshold if grad else None, "detail": detail, **extra})

    for c in report.components:
        add("component", f"{c.slot}={c.name}", c.check, c.declared, c.verdict, c.ok or c.buggy,
            detail="; ".join(x for x in (c.diagnosis, c.detail) if x), max_abs=c.max_abs, threshold=c.threshold,
            plugin=c.plugin)
    for p in report.pairs:
        add("pair", p.a, p.b, p.expected, p.verdict, p.ok, p.logits, p.grad_max,
            "; ".join(p.declared + p.notes))
    for p in report.probes:
        add("probe", p.subject, f"{p.probe} ({p.mode})", "unchanged", "pass" if p.passed else "leak", p.passed,
            detail=p.detail, max_abs=p.max_change, threshold=p.threshold)
    for m in report.masks:
        add("mask component", m.component, "reference masked softmax", "equal",
            "pass" if m.passed else "fail", m.passed or m.buggy, detail=m.detail, max_abs=m.max_error,
            fully_masked_row=m.fully_masked_row)
    for section, items in (("nn.MultiheadAttention", report.mha), ("nn.Transformer", report.transformer),
                           ("device", report.devices)):
        for r in items:
            add(section, r.subject, r.reference, r.expected, r.verdict, r.ok or r.buggy, r.output, r.grad_max,
                r.detail, padded_rows_max_abs=r.padded_rows)
    for t in report.ties:
        add("tied parameters", t.variant, "construction, .to, load_state_dict", "ties preserved",
            "pass" if t.passed else "fail", t.passed, detail=t.detail or "; ".join(",".join(g) for g in t.groups),
            params_unique=t.params_unique, params_per_use=t.params_per_use)
    for b in report.bugs:
        add("faithful bug", b.variant, "all checks", "flagged", "flagged" if b.flagged else "NOT flagged",
            b.flagged, detail=" | ".join(b.reasons))
    df = pd.DataFrame(rows)
    # pandas would turn the mixed None/float columns into object dtype; keep them numeric
    for c in ("max_abs", "threshold", "ref_error", "float64_diff", "grad_max_abs", "grad_threshold"):
        if c in df:
            df[c] = pd.to_numeric(df[c], errors="coerce")
    return df


def class_summary(report: CheckReport) -> list[dict]:
    """Per equivalence class (and per PyTorch reference): the largest error seen and the tolerance
    it was held to (the pair and tensor closest to its threshold)."""
    out = []
    for cls in report.classes():
        if len(cls) < 2:
            continue
        members = set(cls)
        inside = [p for p in report.pairs if p.a in members and p.b in members and p.verdict in (IDENTICAL, EQUIVALENT)]
        out.append(_summary_row(", ".join(cls), [(f"{p.a} vs {p.b}", p.diffs) for p in inside]))
    for label, items in (("attention components vs nn.MultiheadAttention", report.mha),
                         ("stacks vs nn.Transformer", report.transformer),
                         ("cpu vs cuda", report.devices)):
        matched = [(f"{r.subject} / {r.reference}", r.diffs) for r in items
                   if r.verdict in (IDENTICAL, EQUIVALENT) and not r.buggy]
        if matched:
            out.append(_summary_row(label, matched))
    return out


def _summary_row(label: str, items: list[tuple[str, list[TensorDiff]]]) -> dict:
    flat = [(where, d) for where, ds in items for d in ds]
    biggest = max(flat, key=lambda wd: wd[1].max_abs, default=None)
    tightest = max(flat, key=lambda wd: wd[1].ratio, default=None)
    return {"class": label, "comparisons": len(items),
            "largest max|Δ|": _fmt(biggest[1].max_abs) if biggest else "—",
            "where": f"{biggest[0]}: {biggest[1].name}" if biggest else "—",
            "held to": _fmt(biggest[1].threshold) if biggest else "—",
            "closest to its threshold": (f"{_fmt(tightest[1].max_abs)} / {_fmt(tightest[1].threshold)} "
                                         f"({tightest[0]}: {tightest[1].name})") if tightest else "—"}


def _md(df) -> str:
    from .report import to_markdown

    return to_markdown(df)


def render_text(report: CheckReport) -> str:
    """What ``check`` prints: the matrix, the classes, failures and flagged bugs."""
    import pandas as pd

    parts = []
    if report.variants:
        parts += ["Equivalence matrix (" + f"{report.device}, {report.dtype}; " + LEGEND + ")", "",
                  _md(matrix_frame(report)), ""]
        parts += ["Equivalence classes:", ""]
        parts += [f"  {{{', '.join(c)}}}" for c in report.classes()]
        parts += ["", _md(pd.DataFrame(class_summary(report))), ""]
    if report.bugs:
        parts += ["Faithful-bug variants:", ""]
        for b in report.bugs:
            parts.append(f"  {b.variant}: {'flagged' if b.flagged else 'NOT FLAGGED'}")
            parts += [f"    - {r}" for r in b.reasons[:3]]
        parts.append("")
    fails = report.failures()
    parts.append(f"{len(fails)} result(s) do not match their declaration" + (":" if fails else "."))
    parts += [f"  - {f}" for f in fails]
    return "\n".join(parts)


def render_markdown(report: CheckReport, meta: dict) -> str:
    """``checks.md``: environment, config, tolerance table, matrix, classes, every section's table."""
    import dataclasses
    import json

    import pandas as pd

    env = meta.get("environment", {})
    parts = [f"# transformer-harness checks `{meta.get('run_id', '')}`", "",
             "Command:", "", f"```\n{meta.get('command', '')}\n```", "", "## Environment", ""]
    parts += [f"- {k}: `{v}`" for k, v in env.items() if v is not None]
    parts += [f"- check dtype: `{report.dtype}`, seed: `{report.seed}`",
              f"- TF32: {report.tf32}", f"- check wall time: {report.wall_s:.1f} s", "",
              "## Config", "", f"```json\n{json.dumps(dataclasses.asdict(report.cfg))}\n```", "",
              "Batch: B=4, S=9, T=10 with right padding (row i ends with i pad tokens); logits compared at real "
              "target positions, gradients of every canonical parameter (mean cross-entropy against fixed labels). "
              "Every variant holds one reference canonical state (random LayerNorm gains and biases included).", "",
              "## Tolerances", "",
              "threshold = max(atol, fudge × ref_error), ref_error = max |run − float64 run of the same variant| "
              "(PyTorch test_transformers' recipe). The row used here is marked.", ""]
    tol_rows = [{"dtype": d, "device": dev, "atol": t.atol, "fudge": t.fudge, "note": t.note,
                 "used": "◀" if (d, dev) == (report.dtype, report.device) else ""} for (d, dev), t in TOLERANCES.items()]
    parts += [_md(pd.DataFrame(tol_rows)), ""]
    if report.components:
        from .contracts import SLOT_REFERENCES

        parts += ["## Components vs their slot's reference", "",
                  "Each component on its own, with the harness's reference siblings (docs/components.md). "
                  "References: " + "; ".join(f"**{k}**: {v}" for k, v in SLOT_REFERENCES.items()), "",
                  _md(pd.DataFrame([{"component": f"{c.slot}={c.name}" + (" [bug]" if c.buggy else ""),
                                     "plugin": c.plugin, "held to": c.declared, "check": c.check,
                                     "verdict": c.verdict, "max|Δ|": _fmt(c.max_abs), "threshold": _fmt(c.threshold),
                                     "diagnosis": c.diagnosis or c.detail} for c in report.components])), ""]
    if report.variants:
        parts += ["## Equivalence matrix", "", LEGEND, "", _md(matrix_frame(report)), "",
                  "## Equivalence classes", ""]
        parts += [f"- {{{', '.join(c)}}}" for c in report.classes()]
        parts += ["", "Largest error seen in each class (and per PyTorch reference) and the tolerance it was held to:",
                  "", _md(pd.DataFrame(class_summary(report))), "", "## Pairs", ""]
        prow = [{"A": p.a, "B": p.b, "expected": p.expected, "verdict": p.verdict,
                 "max|Δ logits|": _fmt(p.logits.max_abs if p.logits else None),
                 "threshold": _fmt(p.logits.threshold if p.logits else None),
                 "float64 Δ": _fmt(p.logits.golden if p.logits else None),
                 "max|Δ grad|": _fmt(p.grad_max.max_abs if p.grad_max else None),
                 "grad": p.grad_max.name if p.grad_max else "", "declared differences": "; ".join(p.declared),
                 "notes": "; ".join(p.notes)} for p in report.pairs]
        parts += [_md(pd.DataFrame(prow)), ""]
        notes = [(name, r.notes) for name, r in report.runs.items() if r.notes]
        if notes:
            parts += ["Lossy loads of the reference state (what a variant cannot hold):", ""]
            parts += [f"- {name}: {'; '.join(n[:3])}{' ...' if len(n) > 3 else ''}" for name, n in notes]
            parts.append("")
    parts += ["## Mask probes", "",
              "Causal leak: the target tokens after position c change (every c); logits at real positions <= c "
              "must not. Masked source keys: the tokens at padded source positions change, masks kept; logits at "
              "real target positions must not. Train mode re-seeds the RNG before each forward (dropout "
              f"{report.cfg.dropout}), so both forwards drop the same units. Threshold: the variant's own "
              "threshold for its logits.", ""]
    parts += [_md(pd.DataFrame([{"variant": p.subject, "probe": p.probe, "mode": p.mode,
                                 "result": "pass" if p.passed else "LEAK", "max change": _fmt(p.max_change),
                                 "threshold": _fmt(p.threshold), "detail": p.detail} for p in report.probes])), ""]
    parts += ["### Mask components", "",
              "softmax(apply(scores, mask)) vs the reference masked softmax at real query rows; fully masked row: "
              "a source made only of pad tokens.", ""]
    parts += [_md(pd.DataFrame([{"mask": m.component + (" [bug]" if m.buggy else ""),
                                 "padding": "ok" if m.padding_ok else "FAIL", "causal": "ok" if m.causal_ok else "FAIL",
                                 "max error": _fmt(m.max_error), "fully masked row": m.fully_masked_row,
                                 "detail": m.detail} for m in report.masks])), ""]
    parts += ["## Attention components vs torch.nn.MultiheadAttention", "",
              "in_proj_weight = [w_q; w_k; w_v], out_proj = w_o; MHA masks from the ids (bool, True = blocked). "
              "Output compared at real query rows; `padded rows` = max|Δ| at padded query rows (information only: "
              "valid_lens is causal-only there).", ""]
    parts += [_md(_reference_rows(report.mha, padded=True)), ""]
    parts += ["## Encoder-decoder stacks vs torch.nn.Transformer", "",
              "Same embedded inputs (embeddings, scaling and positional encoding are outside nn.Transformer); "
              "decoder output at real target positions and gradients of every stack parameter.", ""]
    parts += [_md(_reference_rows(report.transformer)), ""]
    parts += ["## Tied parameters", ""]
    parts += [_md(pd.DataFrame([{"variant": t.variant, "tied groups": " | ".join(", ".join(g) for g in t.groups) or "none",
                                 "params (unique)": t.params_unique, "params (per use)": t.params_per_use,
                                 "untied counterpart Δ logits / Δ grad": (
                                     f"{_fmt(t.untied_logits)} / {_fmt(t.untied_grad)}"
                                     if t.untied_logits is not None else "—"),
                                 "result": "pass" if t.passed else "FAIL", "detail": t.detail} for t in report.ties])), ""]
    parts += ["## CPU vs CUDA", ""]
    parts += [_md(_reference_rows(report.devices)), ""]
    if report.bugs:
        parts += ["## Faithful-bug variants", "",
                  "Reproduced on purpose from the seed notes; every one must be flagged.", ""]
        for b in report.bugs:
            parts.append(f"- **{b.variant}** ({b.summary}): {'flagged' if b.flagged else '**NOT flagged**'}")
            parts += [f"  - {r}" for r in b.reasons]
        parts.append("")
    fails = report.failures()
    parts += ["## Result", "", f"{len(fails)} result(s) do not match their declaration."]
    parts += [f"- {f}" for f in fails]
    return "\n".join(parts) + "\n"


def _reference_rows(items: list[ReferenceResult], padded: bool = False):
    import pandas as pd

    rows = []
    for r in items:
        row = {"subject": r.subject + (" [bug]" if r.buggy else ""), "reference": r.reference, "verdict": r.verdict,
               "max|Δ out|": _fmt(r.output.max_abs if r.output else None),
               "threshold": _fmt(r.output.threshold if r.output else None),
               "max|Δ grad|": _fmt(r.grad_max.max_abs if r.grad_max else None),
               "grad": r.grad_max.name if r.grad_max else ""}
        if padded:
            row["padded rows"] = _fmt(r.padded_rows)
        row["detail"] = r.detail
        rows.append(row)
    return pd.DataFrame(rows)
