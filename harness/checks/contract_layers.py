"""Contracts of the ``layer_norm``, ``norm``, ``embedding`` and ``projections`` slots
each component on its own against its formula in float64, with a diagnosis naming the known fault
that reproduces a wrong output.

Shape letters: B batch, L length, D = d_model, V vocabulary.
Sources: Ba et al. 2016 (LayerNorm); Xiong et al. 2020 (pre-/post-norm); Bachlechner et al. 2021 (ReZero:
a residual block with no LayerNorm); Vaswani et al. 2017 §3.4-3.5.
"""
from __future__ import annotations

import copy
import math

import torch
from torch import nn
from torch.nn import functional as F

from ..config import ModelConfig
from ..model import canonical_init
from ..registry import Component
from .contract_base import (CONFORMS, VIOLATES, ComponentResult, component_result, crash_result,
                            first_wrong_position, formula_result, judge, load_random_state, output_gap,
                            reference_components, rows_length, sibling_context, unknown_formula)
from .formulas import (FORMULAS, batchnorm_faults, batchnorm_reference, parallel_faults, parallel_reference,
                       rmsnorm_faults, rmsnorm_reference)
from .inputs import padded_batch
from .policy import COMPONENT_ATOL, FAULT_MATCH_RTOL, ZERO_GAIN

# --------------------------------------------------------------------------- layer_norm, norm

def check_layer_norm(comp: Component, cfg: ModelConfig, seed: int = 0) -> list[ComponentResult]:
    """``layer_norm`` component vs ``nn.LayerNorm(D)`` holding the same (random) weight and bias, on
    inputs with non-zero mean and varied scale, float64, rows of ``cfg.max_len`` positions
    (:func:`~harness.checks.contract_base.rows_length`; a first wrong position is named); a component declaring ``reference="rms_norm"``
    is held to RMSNorm (:func:`~harness.checks.formulas.rmsnorm_reference`) first."""
    bad = unknown_formula(comp)
    if bad:
        return bad
    label = "vs nn.LayerNorm(d_model)"
    try:
        mod = comp.factory(sibling_context(cfg, reference_components(layer_norm=comp)))
        state = load_random_state(mod, seed)
        ref = nn.LayerNorm(cfg.d_model).double()
        with torch.no_grad():
            ref.weight.copy_(state.get("weight", torch.ones(cfg.d_model)))
            ref.bias.copy_(state.get("bias", torch.zeros(cfg.d_model)))
        g = torch.Generator().manual_seed(seed + 83)
        n = rows_length(cfg, 7)  # up to max_len: statistics that mix positions only in long rows show there
        x = (torch.randn(3, n, cfg.d_model, generator=g) * torch.rand(3, n, 1, generator=g) * 4
             + torch.randn(3, n, 1, generator=g)).double()
        with torch.no_grad():
            got, want = mod.double().eval()(x), ref(x)
    except Exception as exc:  # noqa: BLE001
        return [crash_result(comp, label, exc)]
    held = []
    if comp.reference == "rms_norm":
        xs = torch.cat([x, x[:1] * 1e-3])  # a row of activations ~1e-3: mean(a^2) ~ eps, where eps's place shows
        with torch.no_grad():
            got_s = mod(xs)
        g2, t2 = output_gap(got_s, rmsnorm_reference(xs, ref.weight.detach()))
        fault = next((text for text, alt in rmsnorm_faults(xs, ref.weight.detach()).items()
                      if output_gap(got_s, alt)[0] <= output_gap(got_s, alt)[1]), "") if g2 > t2 else ""
        held = [formula_result(comp, "vs RMSNorm a / RMS(a) * g (Zhang & Sennrich 2019)", g2, t2, fault)]
        label = "declared difference vs nn.LayerNorm(d_model)"
    elif comp.reference == "batch_norm":
        try:
            held = _held_to_batchnorm(comp, mod, x, ref.weight.detach(), ref.bias.detach())
        except Exception as exc:  # noqa: BLE001
            return [crash_result(comp, "vs BatchNorm (Ioffe & Szegedy 2015)", exc)]
        label = "declared difference vs nn.LayerNorm(d_model) (evaluation, running statistics at 0 and 1)"
    if comp.reference != "batch_norm":
        held += _same_in_training(comp, mod, x, got, ref.weight.detach(), ref.bias.detach())
    gap, thr = output_gap(got, want)
    diagnosis = ""
    if gap > thr:
        w, b = ref.weight.detach(), ref.bias.detach()
        mu = x.mean(-1, keepdim=True)
        hyps = {"unbiased variance (n - 1) instead of the biased one": (x - mu) / torch.sqrt(x.var(-1, keepdim=True) + 1e-5) * w + b,
                "no mean subtraction (RMS normalisation)": x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w + b,
                "normalised over the sequence axis instead of d_model": (x - x.mean(-2, keepdim=True)) / torch.sqrt(x.var(-2, unbiased=False, keepdim=True) + 1e-5) * w + b,
                "normalised over (L, d_model) instead of d_model alone": (x - x.mean((-2, -1), keepdim=True)) / torch.sqrt(x.var((-2, -1), unbiased=False, keepdim=True) + 1e-5) * w + b,
                "unbiased std with eps added outside the square root": (x - mu) / (x.std(-1, keepdim=True) + 1e-6) * w + b,
                "weight and bias not applied": F.layer_norm(x, (cfg.d_model,))}
        for text, alt in hyps.items():
            g2, t2 = output_gap(got, alt)
            if g2 <= max(t2, FAULT_MATCH_RTOL * float(alt.abs().max())):
                diagnosis = text
                break
        diagnosis = diagnosis or first_wrong_position(got, want, thr)
    return held + [judge(comp, label, gap, thr, diagnosis)]


def _same_in_training(comp: Component, mod: nn.Module, x: torch.Tensor, got_eval: torch.Tensor, w: torch.Tensor,
                      b: torch.Tensor) -> list[ComponentResult]:
    """A LayerNorm (or RMSNorm) has no dropout and no batch statistics: a training forward of a copy of
    ``mod`` on x (B, L, D) must give its evaluation output (float64). Names batch statistics when the
    training output is BatchNorm's (:func:`~harness.checks.formulas.batchnorm_reference`)."""
    label = "training mode vs evaluation mode (a LayerNorm has no batch statistics)"
    try:
        with torch.no_grad():
            got_train = copy.deepcopy(mod).train()(x)
    except Exception as exc:  # noqa: BLE001
        return [crash_result(comp, label, exc)]
    gap, thr = output_gap(got_train, got_eval)
    if gap <= thr:
        return [component_result(comp, label, CONFORMS, True, gap, thr)]
    bn_gap, bn_thr = output_gap(got_train, batchnorm_reference(x, w, b)[0])
    diagnosis = ("normalised with the batch's statistics in training (BatchNorm over every row and position), a "
                 "LayerNorm only in evaluation" if bn_gap <= bn_thr else
                 "computes something else in training than in evaluation")
    return [component_result(comp, label, VIOLATES, False, gap, thr, diagnosis)]


def _held_to_batchnorm(comp: Component, mod: nn.Module, x: torch.Tensor, w: torch.Tensor,
                       b: torch.Tensor) -> list[ComponentResult]:
    """``reference="batch_norm"``: one training forward of a fresh copy of ``mod`` on x (B, L, D) against the
    batch statistics over all B * L rows, then an evaluation forward against the running statistics that
    batch left (:func:`~harness.checks.formulas.batchnorm_reference`); float64."""
    mod = copy.deepcopy(mod).double()
    want_train, want_eval = batchnorm_reference(x, w, b)
    with torch.no_grad():
        got_train = mod.train()(x)
        got_eval = mod.eval()(x)
    gap, thr = output_gap(got_train, want_train)
    fault = next((text for text, alt in batchnorm_faults(x, w, b).items()
                  if output_gap(got_train, alt)[0] <= output_gap(got_train, alt)[1]), "") if gap > thr else ""
    out = [formula_result(comp, "training: vs BatchNorm over the batch's B * L rows (Ioffe & Szegedy 2015)",
                          gap, thr, fault)]
    gap, thr = output_gap(got_eval, want_eval)
    return out + [formula_result(comp, "evaluation: vs the running statistics (momentum 0.1) one batch left",
                                 gap, thr, "" if gap <= thr else "the running statistics are not BatchNorm's "
                                 "(momentum 0.1, unbiased variance) or evaluation still uses the batch's")]


def check_norm(comp: Component, cfg: ModelConfig, seed: int = 0) -> list[ComponentResult]:
    """``norm`` component (residual block) vs the formula its ``final_norm`` claims: post-norm
    LayerNorm(x + f(x)) when False, pre-norm x + f(LayerNorm(x)) when True, with the reference
    ``nn.LayerNorm`` as its LayerNorm and a fixed random sub-layer f; eval mode, float64. A component
    registered with ``has_layer_norm=False`` is held to the residual contract instead
    (:func:`check_residual`); one whose class declares ``parallel = True`` (or that declares
    ``reference="parallel_block"``) to the parallel block (:func:`check_parallel`)."""
    bad = unknown_formula(comp)
    if bad:
        return bad
    if not comp.has_layer_norm:
        return check_residual(comp, cfg, seed)
    label = "residual block vs the formula final_norm claims"
    try:
        mod = comp.factory(sibling_context(cfg, reference_components(norm=comp)))
        if getattr(type(mod), "parallel", False) or comp.reference == "parallel_block":
            return check_parallel(comp, mod, cfg, seed)
        final = getattr(type(mod), "final_norm", None)
        if not isinstance(final, bool):
            return [(component_result(comp, label, VIOLATES, False, detail=(
                "the module has no class attribute final_norm: bool (True = pre-norm with a final LayerNorm)")))]
        state = load_random_state(mod, seed)
        if "norm.weight" not in state:
            return [(component_result(comp, label, VIOLATES, False, detail=(
                f"no LayerNorm child named 'norm' made with ctx.layer_norm() (canonical names: "
                f"{', '.join(sorted(state)) or 'none'}); a residual block with no LayerNorm (ReZero, "
                f"x + alpha * sublayer(x)) declares it: Component(..., has_layer_norm=False, differs=\"...\")")))]
        ln = nn.LayerNorm(cfg.d_model).double()
        with torch.no_grad():
            ln.weight.copy_(state["norm.weight"])
            ln.bias.copy_(state.get("norm.bias", torch.zeros(cfg.d_model)))
        g = torch.Generator().manual_seed(seed + 89)
        f = nn.Linear(cfg.d_model, cfg.d_model).double()
        with torch.no_grad():
            f.weight.copy_(torch.randn(cfg.d_model, cfg.d_model, generator=g) / math.sqrt(cfg.d_model))
            f.bias.copy_(torch.randn(cfg.d_model, generator=g))
        sub = lambda y: torch.tanh(f(y))  # noqa: E731
        x = (torch.randn(3, 5, cfg.d_model, generator=g) * 2 + 0.5).double()
        with torch.no_grad():
            got = mod.double().eval()(x, sub)
            post, pre = ln(x + sub(x)), x + sub(ln(x))
    except Exception as exc:  # noqa: BLE001
        return [crash_result(comp, label, exc)]
    want, other = (pre, post) if final else (post, pre)
    gap, thr = output_gap(got, want)
    diagnosis = ""
    if gap > thr:
        g2, t2 = output_gap(got, other)
        claims = "final_norm = True (pre-norm)" if final else "final_norm = False (post-norm)"
        if g2 <= t2:
            diagnosis = (f"computes {'post-norm LayerNorm(x + sublayer(x))' if final else 'pre-norm x + sublayer(LayerNorm(x))'}"
                         f" but declares {claims}: the stacks would get the wrong final LayerNorm")
        else:
            diagnosis = f"matches neither post-norm nor pre-norm (declares {claims})"
    return [judge(comp, label, gap, thr, diagnosis)]


def check_parallel(comp: Component, mod: nn.Module, cfg: ModelConfig, seed: int = 0) -> list[ComponentResult]:
    """A parallel block (``parallel = True``; GPT-J, PaLM §2) vs x + sum_i f_i(LayerNorm(x))
    (:func:`~harness.checks.formulas.parallel_reference`) with 2 sub-layers (the encoder's) and 3 (the
    decoder's), each a fixed random tanh(Linear), its LayerNorm holding random gains; eval mode, float64.

    Returns:
        a failing result when the class lacks ``parallel = True`` or ``final_norm = True``; else the formula's
        result (the nearest fault of :func:`~harness.checks.formulas.parallel_faults` named on a miss) and the
        size of the difference from chained pre-norm (a failure unless declared with ``differs=``).
    """
    label = "vs the parallel block x + sum_i sublayer_i(LayerNorm(x)) (PaLM §2, GPT-J)"
    if not getattr(type(mod), "parallel", False) or getattr(type(mod), "final_norm", None) is not True:
        return [component_result(comp, label, VIOLATES, False, diagnosis=(
            "declares reference='parallel_block' but its class has no parallel = True: the layers would wrap each "
            "sub-layer in a block of its own" if not getattr(type(mod), "parallel", False) else
            "a parallel block never normalises the residual stream: its class needs final_norm = True (a final "
            "LayerNorm after each stack, GPT-J's ln_f)"))]
    try:
        state = load_random_state(mod, seed)
        if "norm.weight" not in state:
            return [component_result(comp, label, VIOLATES, False, diagnosis=(
                "no LayerNorm child named 'norm' made with ctx.layer_norm(): a parallel block has one LayerNorm"))]
        ln = _layer_norm_from(state, "norm", cfg.d_model)
        norms = [_layer_norm_from(state, n, cfg.d_model) for n in _norm_names(state, cfg.d_model)]
        x, first, _ = _random_sublayer(cfg, seed)
        subs = [first] + [_random_sublayer(cfg, seed + 7 * i)[1] for i in (1, 2)]
        mod = mod.double().eval()
        gaps, fault, chained = [], "", []
        with torch.no_grad():
            for n in (2, 3):
                got = mod(x, list(subs[:n]))
                gap, thr = output_gap(got, parallel_reference(x, subs[:n], ln))
                gaps.append((gap, thr))
                faults = parallel_faults(x, subs[:n], ln)
                chained.append(output_gap(got, next(iter(faults.values()))))
                if gap > thr and not fault:
                    fault = next((f"{text} ({n} sub-layers)" for text, alt in faults.items()
                                  if output_gap(got, alt)[0] <= output_gap(got, alt)[1]), "") or \
                        _two_norms_fault(got, x, subs[:n], norms, _norm_names(state, cfg.d_model))
    except Exception as exc:  # noqa: BLE001
        return [crash_result(comp, label, exc)]
    worst, chained = (max(g, key=lambda gt: gt[0] / gt[1]) for g in (gaps, chained))
    off = worst[0] > worst[1]
    held = component_result(comp, label, VIOLATES if off else CONFORMS, not off, *worst, (fault or (
        f"differs from the parallel block's formula ({FORMULAS['norm']['parallel_block']})")) if off else "")
    return [held, judge(comp, "declared difference vs chained pre-norm x + sublayer(LayerNorm(x))", *chained,
                        "" if comp.differs else "a parallel block computes neither post-norm nor pre-norm: declare it "
                        "with differs=\"...\", reference=\"parallel_block\"")]


def _layer_norm_from(state: dict, name: str, d: int) -> nn.LayerNorm:
    """An ``nn.LayerNorm(d)`` (float64) holding ``state``'s ``<name>.weight`` and ``<name>.bias`` (0 without one)."""
    ln = nn.LayerNorm(d).double()
    with torch.no_grad():
        ln.weight.copy_(state[f"{name}.weight"])
        ln.bias.copy_(state.get(f"{name}.bias", torch.zeros(d)))
    return ln


def _norm_names(state: dict, d: int) -> list[str]:
    """The LayerNorm-like children of a block's canonical ``state`` (a ``.weight`` of shape (d,)), ``norm`` first."""
    names = [k[: -len(".weight")] for k, v in state.items() if k.endswith(".weight") and tuple(v.shape) == (d,)]
    return sorted(names, key=lambda n: n != "norm")


def _two_norms_fault(got: torch.Tensor, x: torch.Tensor, subs: list, norms: list, names: list[str]) -> str:
    """The fault of a parallel block that holds more than one LayerNorm ("" when it holds one): each sub-layer
    reading its own LayerNorm (sub-layer i the i-th norm, the last norm for the rest), when that reproduces
    ``got`` (B, L, D); else only that it holds several."""
    if len(norms) < 2:
        return ""
    alt = x + sum(f(norms[min(i, len(norms) - 1)](x)) for i, f in enumerate(subs))
    held = ", ".join(repr(n) for n in names)
    if output_gap(got, alt)[0] <= output_gap(got, alt)[1]:
        return (f"a LayerNorm for each sub-layer (x + f_1(LN_1(x)) + f_2(LN_2(x)), LayerNorms {held}; GPT-NeoX's "
                f"parallel residual with two norms) where the parallel block has one LayerNorm that every sub-layer "
                f"reads ({len(subs)} sub-layers)")
    return f"the block holds {len(norms)} LayerNorms ({held}) where the parallel block has one that every sub-layer reads"


def _random_sublayer(cfg: ModelConfig, seed: int):
    """(x (3, 5, D), a fixed random sub-layer f(y) = tanh(y W^T + b), its Linear), float64."""
    g = torch.Generator().manual_seed(seed + 89)
    lin = nn.Linear(cfg.d_model, cfg.d_model).double()
    with torch.no_grad():
        lin.weight.copy_(torch.randn(cfg.d_model, cfg.d_model, generator=g) / math.sqrt(cfg.d_model))
        lin.bias.copy_(torch.randn(cfg.d_model, generator=g))
    x = (torch.randn(3, 5, cfg.d_model, generator=g) * 2 + 0.5).double()
    return x, (lambda y: torch.tanh(lin(y))), lin


def _gradient_fault(mod: nn.Module, x: torch.Tensor, sub, extra: dict, when: str) -> str:
    """Backward a fixed random weighting of ``mod(x, sub)``; names the first parameter of ``mod`` (and of
    ``extra``: the sub-layer's) that gets no, a non-finite or an all-zero gradient ("" when none)."""
    params = {**dict(mod.named_parameters()), **extra}
    if not params:
        return ""
    for p in params.values():
        p.grad = None
    out = mod(x, sub)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=out.dtype)
    (out * w).sum().backward()
    for name, p in params.items():
        what = ("no" if p.grad is None else "a non-finite" if not torch.isfinite(p.grad).all()
                else "an all-zero" if not p.grad.any() else "")
        if what:
            return (f"{name} gets {what} gradient {when}: training "
                    f"{'could never move it' if name in dict(mod.named_parameters()) else 'would not reach it'}")
    return ""


def _residual_fault(mod: nn.Module, x: torch.Tensor, sub) -> tuple[str, float, float]:
    """(fault or "", max |out - (x + a * sub(x))|, threshold) of the block ``mod`` on x (B, L, D), with a (D,)
    the least-squares gain per feature of out - x on sub(x)."""
    seen = []

    def recording(y):
        seen.append(y)
        return sub(y)

    with torch.no_grad():
        out0 = mod(x, torch.zeros_like)
        out = mod(x, recording)
        s = sub(x)
    gap0, thr0 = output_gap(out0, x)
    if gap0 > thr0:
        if float(out0.abs().max()) <= thr0:
            return ("drops the residual x: with a zero sub-layer the output is 0, so it computes g(x), "
                    "not x + g(x)"), gap0, thr0
        return ("with a zero sub-layer the output is not x: the residual path changes x (the contract is "
                "x + a * sublayer(x))"), gap0, thr0
    if not seen:
        return "never calls the sub-layer", math.inf, COMPONENT_ATOL
    gi, ti = max((output_gap(y, x) for y in seen), key=lambda gt: gt[0] / gt[1])
    if gi > ti:
        return ("the sub-layer is applied to a transformation of x, not to x (a LayerNorm or a scale before "
                "it?)"), gi, ti
    r = out - x
    a = (r * s).sum((0, 1)) / (s * s).sum((0, 1)).clamp_min(1e-300)  # (D,) least-squares gain per feature
    gap, thr = output_gap(out, x + a * s)
    if gap > thr:
        return ("output - x is not a fixed gain times sublayer(x): the block is not x + a * sublayer(x)",
                gap, thr)
    if float(a.abs().max()) <= ZERO_GAIN:
        return ("the sub-layer's output never reaches the block's output (a = 0 holding random parameters): "
                "the block is the identity"), gap, thr
    return "", gap, thr


def check_residual(comp: Component, cfg: ModelConfig, seed: int = 0) -> list[ComponentResult]:
    """``norm`` component declared ``has_layer_norm=False`` (ReZero, Bachlechner et al. 2021; an identity
    residual) vs the residual contract: no LayerNorm made; ``final_norm`` a bool when given (default
    False: no final LayerNorm); holding random canonical parameters (ReZero's alpha away from 0), a zero
    sub-layer gives x exactly, the sub-layer sees x itself, the output is x + a * sublayer(x) with a fixed
    gain a (D,) fitted per feature (a scalar alpha, a per-feature vector, or 1 for the identity residual),
    a != 0, and gradients reach the block's parameters and the sub-layer; at initialisation every parameter
    of the block gets a gradient (ReZero's alpha = 0 gets one from the sub-layer's output; the sub-layer
    itself gets none then, which is allowed). Eval mode, float64, a fixed random sub-layer tanh(Linear).

    Returns:
        a failing result naming the first fault (whatever ``differs=`` says: a declared difference does not
        make a non-residual a residual block); else the contract's result and, second, the size of the
        declared difference from the formula ``final_norm`` claims.
    """
    label = "residual block without LayerNorm: x + a * sublayer(x)"
    made = []
    counting = Component("_reference", "layer_norm", lambda ctx: made.append(1) or nn.LayerNorm(ctx.cfg.d_model))
    try:
        mod = comp.factory(sibling_context(cfg, reference_components(norm=comp, layer_norm=counting)))
        final = getattr(type(mod), "final_norm", False)
        if made or not isinstance(final, bool):
            return [component_result(comp, label, VIOLATES, False, diagnosis=(
                "declares has_layer_norm=False but makes a LayerNorm with ctx.layer_norm() (drop it, or drop "
                "has_layer_norm=False)" if made else "final_norm, when given, must be a bool class attribute"))]
        x, sub, lin = _random_sublayer(cfg, seed)
        at_init = copy.deepcopy(mod).double().eval()  # as the factory made it (canonical_init below)
        load_random_state(mod, seed)
        mod = mod.double().eval()
        fault, gap, thr = _residual_fault(mod, x, sub)
        with torch.no_grad():
            ln = nn.LayerNorm(cfg.d_model).double()
            claimed = output_gap(mod(x, sub), x + sub(ln(x)) if final else ln(x + sub(x)))
        if not fault:
            fault = _gradient_fault(mod, x, sub, {f"sub-layer {k}": p for k, p in lin.named_parameters()},
                                    "holding random parameters")
        if not fault:
            canonical_init(at_init, seed)
            fault = _gradient_fault(at_init, x, sub, {}, "at initialisation")
    except Exception as exc:  # noqa: BLE001
        return [crash_result(comp, label, exc)]
    if fault:
        return [component_result(comp, label, VIOLATES, False, gap, thr, diagnosis=fault)]
    claims = "pre-norm x + sublayer(LayerNorm(x))" if final else "post-norm LayerNorm(x + sublayer(x))"
    return [component_result(comp, label, CONFORMS, True, gap, thr),
            judge(comp, f"vs {claims} (final_norm = {final})", *claimed)]


# --------------------------------------------------------------------------- embedding, projections

def check_embedding(comp: Component, cfg: ModelConfig, seed: int = 0) -> list[ComponentResult]:
    """``embedding`` component: src/tgt must be per-token lookups of the canonical ``src.weight`` /
    ``tgt.weight`` on a padded batch with rows as long as ``max_len`` (a value that depends on other tokens of the
    row, such as the sequence length, can carry future information past the causal mask; one that changes from
    some position on is named by it), and ``logits`` must be
    x generator.weight^T + generator.bias."""
    label = "lookups and generator vs the canonical matrices"
    try:
        mod = comp.factory(sibling_context(cfg, reference_components(embedding=comp)))
        state = load_random_state(mod, seed)
        mod = mod.double().eval()
        src, tgt, _ = padded_batch(cfg, seed=seed, long_rows=2)  # with rows as long as max_len (up to 66)
        x = torch.randn(2, 3, cfg.d_model, generator=torch.Generator().manual_seed(seed + 101)).double()
        with torch.no_grad():
            parts = {"src": (mod.src(src), state["src.weight"].double()[src]),
                     "tgt": (mod.tgt(tgt), state["tgt.weight"].double()[tgt]),
                     "logits": (mod.logits(x), F.linear(x, state["generator.weight"].double(),
                                                        state["generator.bias"].double()
                                                        if "generator.bias" in state else None))}
    except KeyError as exc:
        return [(component_result(comp, label, VIOLATES, False, detail=(
            f"canonical parameter {exc} missing: export src.weight, tgt.weight, generator.weight (and "
            f"generator.bias) from canonical_state()")))]
    except Exception as exc:  # noqa: BLE001
        return [crash_result(comp, label, exc)]
    worst, diagnosis = (0.0, COMPONENT_ATOL), ""
    for part, (got, want) in parts.items():
        gap, thr = output_gap(got, want)
        if gap / thr > worst[0] / worst[1]:
            worst = (gap, thr)
        if gap > thr and not diagnosis:
            where = first_wrong_position(got, want, thr) if part in ("src", "tgt") else ""
            diagnosis = (f"{part}(ids) is not a per-token lookup of {part}.weight: {where}" if where else
                         f"{part}(ids) is not a per-token lookup of {part}.weight: the value at a position depends on "
                         f"other tokens of its row (e.g. the sequence length), which lets the decoder see the future "
                         f"past the causal mask" if part in ("src", "tgt") else
                         "logits(x) differs from x generator.weight^T + generator.bias")
    return [judge(comp, label, worst[0], worst[1], diagnosis)]


def check_projections(comp: Component, cfg: ModelConfig, seed: int = 0) -> list[ComponentResult]:
    """``projections`` component: ``linear(d_in, d_out)`` must return a module with ``weight``
    (d_out, d_in) (and optional ``bias`` (d_out,)) computing x weight^T + bias (float64)."""
    label = "linear(d_in, d_out) vs x weight^T + bias"
    try:
        linear = comp.factory(sibling_context(cfg, reference_components(projections=comp)))
        d_in, d_out = cfg.d_model, 2 * cfg.d_model
        with torch.random.fork_rng(devices=[]):  # its initial weights from the check's seed: the same verdict
            torch.manual_seed(seed + 101)  # and threshold in every process, the caller's RNG untouched
            lin = linear(d_in, d_out).double()
        w, b = getattr(lin, "weight", None), getattr(lin, "bias", None)
        if not isinstance(w, torch.Tensor) or tuple(w.shape) != (d_out, d_in):
            return [(component_result(comp, label, VIOLATES, False, detail=(
                f"linear({d_in}, {d_out}) must have weight of shape ({d_out}, {d_in}); got "
                f"{None if w is None else tuple(w.shape)}")))]
        x = torch.randn(3, 4, d_in, generator=torch.Generator().manual_seed(seed + 103)).double()
        with torch.no_grad():
            got, want = lin(x), F.linear(x, w, b)
    except Exception as exc:  # noqa: BLE001
        return [crash_result(comp, label, exc)]
    gap, thr = output_gap(got, want)
    return [judge(comp, label, gap, thr)]


