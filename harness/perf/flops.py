"""Model FLOPs of a training step and the machine's matmul throughput: the two sides of MFU.

:func:`count_flops` counts every matmul and attention of one forward + backward with
``torch.utils.flop_counter.FlopCounterMode`` (so every way of writing attention counts the same);
:func:`matmul_seconds` times one square matmul, the measured peak that ``bench`` divides by
(Chowdhery et al. 2022, PaLM, appendix B, with a measured rather than a datasheet peak).
"""
from __future__ import annotations

import time

import torch
from torch import nn

from ..config import RunConfig
from ..env import autocast
from ..tasks.base import Batch, loss_fn

#: Dtypes by name.
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def sync(device: torch.device) -> None:
    """Wait for ``device``'s queued work (CUDA); nothing on the CPU. Every clock read around device work follows it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _sdpa_flops(query_shape, key_shape, value_shape, *args, **kwargs) -> int:
    """Forward SDPA: the two matmuls Q K^T and P V."""
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _sdpa_backward_flops(grad_out_shape, query_shape, key_shape, value_shape, *args, **kwargs) -> int:
    """Backward SDPA as *model* FLOPs: 2 x forward (four matmuls). PyTorch's own formula
    adds the fused kernels' recomputation of Q K^T, which a plain matmul attention never does."""
    from torch.utils.flop_counter import sdpa_flop_count

    return 2 * sdpa_flop_count(query_shape, key_shape, value_shape)


def _flop_formulas() -> dict:
    aten = torch.ops.aten
    out = {}
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):  # not in torch's table
        out[aten._scaled_dot_product_flash_attention_for_cpu] = _sdpa_flops
    for name in ("_scaled_dot_product_flash_attention_for_cpu_backward", "_scaled_dot_product_flash_attention_backward",
                 "_scaled_dot_product_efficient_attention_backward", "_scaled_dot_product_cudnn_attention_backward"):
        if hasattr(aten, name):
            out[getattr(aten, name)] = _sdpa_backward_flops
    return out


def count_flops(model: nn.Module, batch: Batch, cfg: RunConfig, device: torch.device, dtype: str) -> int:
    """Model FLOPs of one training forward + backward on ``batch``, counted by
    ``FlopCounterMode``: every matmul and attention (PyTorch's CPU flash attention included,
    fused attention backward without its recomputation, so that every way of writing attention
    counts the same). Leaves the gradients cleared."""
    from torch.utils.flop_counter import FlopCounterMode

    model.train()
    with FlopCounterMode(display=False, custom_mapping=_flop_formulas()) as counter:
        with autocast(device, dtype):
            logits = model(batch.src, batch.tgt)
        loss_fn(logits, batch.tgt_y, cfg.model.pad, cfg.train.label_smoothing).backward()
    model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


_OPERANDS: dict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def matmul_seconds(dtype: str, device: torch.device, n: int) -> float:
    """Wall time of one (n x n) @ (n x n) matmul in ``dtype`` (2 n^3 FLOP), seconds.

    The operands are made once per (dtype, device, n) and kept, so only the matmul is timed.
    """
    key = (dtype, str(device), n)
    if key not in _OPERANDS:
        g = torch.Generator(device="cpu").manual_seed(0)
        a, b = (torch.randn(n, n, generator=g).to(device, DTYPES[dtype]) for _ in range(2))
        _OPERANDS[key] = (a, b, torch.empty(n, n, device=device, dtype=DTYPES[dtype]))
    a, b, out = _OPERANDS[key]
    sync(device)
    t0 = time.perf_counter()
    torch.mm(a, b, out=out)
    sync(device)
    return time.perf_counter() - t0


def forget_operands() -> None:
    """Free the operands :func:`matmul_seconds` keeps (at 8192 x 8192, 3 x 256 MiB in float32)."""
    _OPERANDS.clear()
