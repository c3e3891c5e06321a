"""Attention components against ``torch.nn.MultiheadAttention`` with mapped weights.

``in_proj_weight`` = [w_q; w_k; w_v] (3D, D), ``out_proj`` = w_o; MHA's bool masks mean True = blocked.
Grouped-query attention (``w_k``, ``w_v`` of (n_kv d_k, D)) is mapped to the multi-head attention that
computes the same function: each K/V head's rows repeated for its h / n_kv query heads; the MHA
gradients of the repeats are summed back per K/V head.

Shape letters: B batch, S source length, T target length, D = d_model.
"""
from __future__ import annotations

import torch
from torch import nn

from ..config import ModelConfig
from ..model import BuildContext, canonical_state_dict, load_canonical_state_dict
from ..registry import Registry, Variant
from .contract_attention import ATTENTION_LAYOUT
from .inputs import CHECK_MODEL, autocast, describe_exception, draw_reference_state, padded_batch
from .pairs import CRASHES, UNEXPECTED, ReferenceResult, max_abs_diff, reference_verdict, tensor_diff
from .expectations import held_to_reference, registry_groups, slot_default
from .policy import get_tolerance
from .runs import canonical_grads

def _resolved_components(registry: Registry, slots: dict[str, str]):
    return {slot: registry.component(slot, name) for slot, name in Variant("_check", slots).resolved().items()}


def _grouped(t: torch.Tensor, d: int, h: int) -> torch.Tensor:
    """K/V rows (n_kv d_k, ...) of grouped-query attention -> the (D, ...) rows of the multi-head attention
    computing the same function: each K/V head's rows repeated for its h / n_kv query heads (repeat_kv)."""
    d_k = d // h
    n_kv = t.size(0) // d_k
    return t.reshape(n_kv, 1, d_k, *t.shape[1:]).expand(n_kv, h // n_kv, d_k, *t.shape[1:]).reshape(d, *t.shape[1:])


def _mha_state(attn_state: dict[str, torch.Tensor], has_bias: bool, h: int) -> dict[str, torch.Tensor]:
    d = attn_state["w_q.weight"].size(0)
    out = {"in_proj_weight": torch.cat([_grouped(attn_state[f"w_{x}.weight"], d, h) for x in "qkv"]),
           "out_proj.weight": attn_state["w_o.weight"]}
    if has_bias:
        out["in_proj_bias"] = torch.cat([_grouped(attn_state[f"w_{x}.bias"], d, h) for x in "qkv"])
        out["out_proj.bias"] = attn_state["w_o.bias"]
    return out


def _ungrouped(g: torch.Tensor, rows: int, h: int) -> torch.Tensor:
    """The gradient of grouped K/V rows (``rows`` = n_kv d_k) from the MHA gradient (D, ...) of their repeats."""
    d = g.size(0)
    n_kv = rows // (d // h)
    return g.reshape(n_kv, h // n_kv, d // h, *g.shape[1:]).sum(1).reshape(rows, *g.shape[1:])


def _mha_grads(mha: nn.MultiheadAttention, d: int, rows: dict[str, int]) -> dict[str, torch.Tensor]:
    out = {"w_o.weight": mha.out_proj.weight.grad}
    h = mha.num_heads
    for i, x in enumerate("qkv"):
        out[f"w_{x}.weight"] = _ungrouped(mha.in_proj_weight.grad[i * d:(i + 1) * d], rows[x], h)
        if mha.in_proj_bias is not None:
            out[f"w_{x}.bias"] = _ungrouped(mha.in_proj_bias.grad[i * d:(i + 1) * d], rows[x], h)
    if mha.out_proj.bias is not None:
        out["w_o.bias"] = mha.out_proj.bias.grad
    return {k: v.detach().cpu().clone() for k, v in out.items()}


def compare_attention_with_mha(registry: Registry, attention: str, mask: str | None = None,
                               projections: str | None = None, cfg: ModelConfig | None = None, *,
                               device: torch.device | str = "cpu", dtype: str = "fp32", seed: int = 0, groups=None,
                               expected: str | None = None) -> list[ReferenceResult]:
    """Attention component vs ``torch.nn.MultiheadAttention`` with mapped weights, for self-attention
    (causal + padding mask, T x T) and cross-attention (source padding mask, T x S).

    ``in_proj_weight`` = cat(w_q, w_k, w_v) (3D, D), ``out_proj`` = w_o. The reference masks are
    made from the token ids in MHA's convention (bool, True = blocked: ``attn_mask`` (T, T) causal,
    ``key_padding_mask`` (B, L)); the component gets its own mask component's masks. Output (B, T, D)
    is compared at real query rows (the ``valid_lens`` style is causal-only at padded rows; the max
    |Δ| there is reported as ``padded_rows``), gradients for every canonical weight and both inputs.
    ``mask`` and ``projections`` default to their slots' defaults (:func:`slot_default`).
    """
    mask = mask or slot_default("mask")
    projections = projections or slot_default("projections")
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
        padded = max_abs_diff(o[~real].double(), m[~real].double()) if (~real).any() else None
        grads = [tensor_diff(n, og[n], mg[n], og64[n], mg64[n], tol) for n in sorted(og) if n in mg]  # QK-norm gains: ours only
        results.append(reference_verdict(subject, reference, expected, out, grads, buggy, padded))
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
    missing = [n for n in ATTENTION_LAYOUT if n not in names]
    if missing:
        raise _LayoutError(f"attention component does not export the canonical layout (missing {', '.join(missing)}; "
                           f"has {', '.join(sorted(names)) or 'nothing'})")
    state = draw_reference_state({n: tuple(v.shape) for n, v in names.items()}, seed)
    load_canonical_state_dict(attn, state)
    has_bias = "w_q.bias" in state
    mha = nn.MultiheadAttention(cfg.d_model, cfg.h, dropout=0.0, bias=has_bias, batch_first=True)
    mha.load_state_dict(_mha_state(state, has_bias, cfg.h))
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
        with autocast(device, run_dtype):
            out = module(q, kv, kv, ours_mask) if module is attn else \
                module(q, kv, kv, need_weights=False, **ref_kw)[0]
        (out.to(wdtype) * weight).sum().backward()
        grads = canonical_grads(attn) if module is attn else _mha_grads(mha, cfg.d_model, {x: state[f"w_{x}.weight"].size(0) for x in "qkv"})
        grads["input query"] = q.grad.detach().cpu().clone()
        if kind == "cross":
            grads["input memory"] = kv.grad.detach().cpu().clone()
        outs += [out.detach().cpu(), grads]
    return outs
