"""Slot ``attention``: four ways to write multi-head attention (Vaswani et al. 2017 §3.2).

All compute MultiHead(Q, K, V) = Concat(head_1..head_h) W_o with
head_i = softmax(Q W_q^i (K W_k^i)^T / sqrt(d_k)) V W_v^i, dropout on the attention weights.

* ``annotated``: four cloned ``Linear``s, heads as (B, H, L, d_k), ``torch.matmul``
  -- Annotated Transformer ``MultiHeadedAttention`` (note 000).
* ``d2l``: ``W_q, W_k, W_v, W_o``, heads folded into the batch as (B*H, L, d_k) by
  ``transpose_qkv``/``transpose_output``, ``torch.bmm`` -- d2l §10.5 (notes 001, 003). The
  mask is repeated per head in batch-major order (d2l's ``repeat_interleave`` of valid_lens).
* ``torch``: the same projections, then ``F.scaled_dot_product_attention``; the mask
  component's ``apply`` on a zero tensor gives the additive bias SDPA takes.
* ``happy_llm``: ``wq, wk, wv, wo``, heads (B, H, L, d_k), softmax computed in float32 and
  cast back, dropout on the weights and on the output (note 002; its K/V reshape bug fixed).

Canonical parameters (every component): ``w_q, w_k, w_v, w_o`` ``.weight`` (D, D) and, when
the ``projections`` slot gives biases, ``.bias`` (D,). Shape of ``forward``: query (B, Tq, D),
key/value (B, Tk, D), mask from the mask component -> (B, Tq, D).
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from harness import Component, hookimpl

_CANONICAL = ("w_q", "w_k", "w_v", "w_o")


class _Projected(nn.Module):
    """Shared plumbing: head sizes, dropout, the mask's ``apply`` and the canonical mapping.

    Subclasses name their four projections in ``_proj_names`` (in q, k, v, o order).
    """

    _proj_names: tuple[str, str, str, str] = _CANONICAL

    def __init__(self, ctx):
        super().__init__()
        self.h = ctx.cfg.h
        self.d_k = ctx.cfg.d_model // ctx.cfg.h
        self.apply_mask = ctx.mask.apply
        self.positions = ctx.positions
        self.dropout = nn.Dropout(ctx.cfg.dropout)

    def _projections(self) -> list[nn.Linear]:
        return [self.get_submodule(n) for n in self._proj_names]

    def canonical_state(self):
        out = {}
        for cname, lin in zip(_CANONICAL, self._projections()):
            out[f"{cname}.weight"] = lin.weight
            if lin.bias is not None:
                out[f"{cname}.bias"] = lin.bias
        return out

    def load_canonical_state(self, state):
        notes = []
        with torch.no_grad():
            for cname, lin in zip(_CANONICAL, self._projections()):
                lin.weight.copy_(state[f"{cname}.weight"])
                bias = state.get(f"{cname}.bias")
                if lin.bias is not None:
                    lin.bias.copy_(bias if bias is not None else torch.zeros_like(lin.bias))
                elif bias is not None and bool(bias.abs().max() > 0):
                    notes.append(f"{cname}.bias is non-zero but this component has no bias")
        return notes


class AnnotatedAttention(_Projected):
    """Annotated Transformer ``MultiHeadedAttention``: ``linears = clones(Linear(D, D), 4)``."""

    _proj_names = ("linears.0", "linears.1", "linears.2", "linears.3")

    def __init__(self, ctx):
        super().__init__(ctx)
        d = ctx.cfg.d_model
        self.linears = nn.ModuleList([ctx.linear(d, d) for _ in range(4)])

    def attention(self, query, key, value, mask):
        """Scaled dot-product attention on (B, H, L, d_k) tensors -> (B, H, Tq, d_k)."""
        scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(self.d_k)  # (B, H, Tq, Tk)
        scores = self.positions.bias(scores)
        if mask is not None:
            scores = self.apply_mask(scores, mask)
        p_attn = self.dropout(scores.softmax(dim=-1))
        return torch.matmul(p_attn, value)

    def forward(self, query, key, value, mask=None):
        b = query.size(0)
        query, key, value = [
            lin(x).view(b, -1, self.h, self.d_k).transpose(1, 2)  # (B, L, D) -> (B, H, L, d_k)
            for lin, x in zip(self.linears, (query, key, value))
        ]
        query, key = self.positions.rotate(query, key)
        x = self.attention(query, key, value, mask)  # (B, H, Tq, d_k)
        x = x.transpose(1, 2).contiguous().view(b, -1, self.h * self.d_k)  # (B, Tq, D)
        return self.linears[-1](x)


def transpose_qkv(x: torch.Tensor, h: int) -> torch.Tensor:
    """d2l §10.5: (B, L, D) -> (B*H, L, d_k), batch-major (index = b*H + head)."""
    x = x.reshape(x.shape[0], x.shape[1], h, -1)  # (B, L, H, d_k)
    x = x.permute(0, 2, 1, 3)  # (B, H, L, d_k)
    return x.reshape(-1, x.shape[2], x.shape[3])  # (B*H, L, d_k)


def transpose_output(x: torch.Tensor, h: int) -> torch.Tensor:
    """d2l §10.5: (B*H, L, d_k) -> (B, L, D), the inverse of :func:`transpose_qkv`."""
    x = x.reshape(-1, h, x.shape[1], x.shape[2])  # (B, H, L, d_k)
    x = x.permute(0, 2, 1, 3)  # (B, L, H, d_k)
    return x.reshape(x.shape[0], x.shape[1], -1)  # (B, L, D)


class D2LAttention(_Projected):
    """d2l ``MultiHeadAttention``: heads folded into the batch, ``bmm``."""

    _proj_names = ("W_q", "W_k", "W_v", "W_o")

    def __init__(self, ctx):
        super().__init__(ctx)
        d = ctx.cfg.d_model
        self.W_q, self.W_k, self.W_v, self.W_o = (ctx.linear(d, d) for _ in range(4))

    def fold_mask(self, mask, b: int):
        """(B or 1, 1, X, Y) -> (B*H, X, Y): the mask repeated per head, batch-major
        (d2l's ``torch.repeat_interleave(valid_lens, repeats=num_heads, dim=0)``)."""
        return mask.expand(b, self.h, *mask.shape[2:]).reshape(b * self.h, *mask.shape[2:])

    def dot_product_attention(self, queries, keys, values, mask):
        """d2l ``DotProductAttention`` on (B*H, L, d_k) tensors -> (B*H, Tq, d_k)."""
        scores = torch.bmm(queries, keys.transpose(1, 2)) / math.sqrt(self.d_k)  # (B*H, Tq, Tk)
        scores = self.positions.bias(scores)
        if mask is not None:
            scores = self.apply_mask(scores, self.fold_mask(mask, queries.size(0) // self.h))
        return torch.bmm(self.dropout(scores.softmax(dim=-1)), values)

    def forward(self, queries, keys, values, mask=None):
        queries = transpose_qkv(self.W_q(queries), self.h)  # (B*H, Tq, d_k)
        keys = transpose_qkv(self.W_k(keys), self.h)  # (B*H, Tk, d_k)
        values = transpose_qkv(self.W_v(values), self.h)  # (B*H, Tk, d_k)
        queries, keys = self.positions.rotate(queries, keys)
        output = self.dot_product_attention(queries, keys, values, mask)
        return self.W_o(transpose_output(output, self.h))  # (B, Tq, D)


class TorchSDPAttention(_Projected):
    """Projections + ``torch.nn.functional.scaled_dot_product_attention``.

    SDPA's bool masks mean True = attend, the opposite of ``nn.MultiheadAttention``; to stay
    independent of the mask convention this component passes a float bias made by the mask
    component itself: ``apply(zeros (B, 1, Tq, Tk), mask)`` (0 where kept, -1e9 or -inf where blocked).
    """

    def __init__(self, ctx):
        super().__init__(ctx)
        d = ctx.cfg.d_model
        self.w_q, self.w_k, self.w_v, self.w_o = (ctx.linear(d, d) for _ in range(4))
        self.p = ctx.cfg.dropout

    def forward(self, query, key, value, mask=None):
        b, tq, tk = query.size(0), query.size(1), key.size(1)
        q = self.w_q(query).view(b, tq, self.h, self.d_k).transpose(1, 2)  # (B, H, Tq, d_k)
        k = self.w_k(key).view(b, tk, self.h, self.d_k).transpose(1, 2)  # (B, H, Tk, d_k)
        v = self.w_v(value).view(b, tk, self.h, self.d_k).transpose(1, 2)  # (B, H, Tk, d_k)
        return self.w_o(sdpa_heads(self, q, k, v, mask))


def sdpa_heads(attn: _Projected, q, k, v, mask) -> torch.Tensor:
    """Positions, the mask as a float bias, ``F.scaled_dot_product_attention``, heads merged.

    q (B, H, Tq, d_k), k and v (B, H, Tk, d_k) -> (B, Tq, D) before the output projection.
    """
    b, tq, tk = q.size(0), q.size(2), k.size(2)
    q, k = attn.positions.rotate(q, k)
    bias = None
    if mask is not None or attn.positions.acts:
        bias = q.new_zeros(b, 1, tq, tk)
        if mask is not None:
            bias = attn.apply_mask(bias, mask).to(q.dtype)  # (B, 1, Tq, Tk)
        bias = attn.positions.bias(bias)  # (B, H, Tq, Tk) with ALiBi
    x = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=attn.p if attn.training else 0.0)
    return x.transpose(1, 2).reshape(b, tq, attn.h * attn.d_k)  # (B, Tq, D)


class PackedSDPAttention(_Projected):
    """One packed ``qkv`` Linear (D -> 3D, rows [w_q; w_k; w_v]) and SDPA (nanoGPT ``c_attn``, timm ``qkv``).

    Canonical ``w_q``, ``w_k``, ``w_v`` are row slices (views) of ``qkv.weight`` / ``qkv.bias``.
    """

    def __init__(self, ctx):
        super().__init__(ctx)
        d = ctx.cfg.d_model
        self.qkv = ctx.linear(d, 3 * d)
        self.w_o = ctx.linear(d, d)
        self.p = ctx.cfg.dropout

    def _rows(self, i: int, n: int = 1):
        """Rows [i*D, (i+n)*D) of the packed weight and bias (views)."""
        d = self.h * self.d_k
        bias = None if self.qkv.bias is None else self.qkv.bias[i * d:(i + n) * d]
        return self.qkv.weight[i * d:(i + n) * d], bias

    def canonical_state(self):
        out = {}
        for i, name in enumerate(("w_q", "w_k", "w_v")):
            w, bias = self._rows(i)
            out[f"{name}.weight"] = w
            if bias is not None:
                out[f"{name}.bias"] = bias
        out["w_o.weight"] = self.w_o.weight
        if self.w_o.bias is not None:
            out["w_o.bias"] = self.w_o.bias
        return out

    def load_canonical_state(self, state):
        notes = []
        with torch.no_grad():
            for name, t in self.canonical_state().items():
                t.copy_(state[name])
            for name in ("w_q", "w_k", "w_v", "w_o"):
                if self.w_o.bias is None and f"{name}.bias" in state and bool(state[f"{name}.bias"].abs().max() > 0):
                    notes.append(f"{name}.bias is non-zero but this component has no bias")
        return notes

    def forward(self, query, key, value, mask=None):
        b, tq, tk = query.size(0), query.size(1), key.size(1)
        if query is key and key is value:  # self-attention: one matmul
            q, k, v = self.qkv(query).split(self.h * self.d_k, dim=-1)  # 3 x (B, L, D)
        else:  # cross-attention: the q rows on the query, the k and v rows on the memory
            q = F.linear(query, *self._rows(0))
            k, v = F.linear(key, *self._rows(1, 2)).split(self.h * self.d_k, dim=-1)
        q = q.view(b, tq, self.h, self.d_k).transpose(1, 2)  # (B, H, Tq, d_k)
        k = k.view(b, tk, self.h, self.d_k).transpose(1, 2)  # (B, H, Tk, d_k)
        v = v.view(b, tk, self.h, self.d_k).transpose(1, 2)  # (B, H, Tk, d_k)
        return self.w_o(sdpa_heads(self, q, k, v, mask))


class HappyLLMAttention(_Projected):
    """happy-llm ``MultiHeadAttention`` (note 002): float32 softmax, attention and residual dropout.

    Fixed: the note reshaped K and V with the *query's* length (crash when S != T).
    """

    _proj_names = ("wq", "wk", "wv", "wo")

    def __init__(self, ctx):
        super().__init__(ctx)
        d = ctx.cfg.d_model
        self.wq, self.wk, self.wv, self.wo = (ctx.linear(d, d) for _ in range(4))
        self.resid_dropout = nn.Dropout(ctx.cfg.dropout)

    def split(self, x: torch.Tensor, length: int) -> torch.Tensor:
        return x.view(x.size(0), length, self.h, self.d_k).transpose(1, 2)  # (B, L, D) -> (B, H, L, d_k)

    def forward(self, q, k, v, mask=None):
        bsz, seqlen, _ = q.shape
        xq = self.split(self.wq(q), seqlen)
        xk = self.split(self.wk(k), k.size(1))
        xv = self.split(self.wv(v), v.size(1))
        xq, xk = self.positions.rotate(xq, xk)
        scores = torch.matmul(xq, xk.transpose(2, 3)) / math.sqrt(self.d_k)  # (B, H, Tq, Tk)
        scores = self.positions.bias(scores)
        if mask is not None:
            scores = self.apply_mask(scores, mask)
        scores = F.softmax(scores.float(), dim=-1).type_as(xq)
        output = torch.matmul(self.dropout(scores), xv)  # (B, H, Tq, d_k)
        output = output.transpose(1, 2).contiguous().view(bsz, seqlen, -1)  # (B, Tq, D)
        return self.resid_dropout(self.wo(output))


@hookimpl
def harness_add_components():
    return [
        Component("annotated", "attention", AnnotatedAttention,
                  "four cloned Linears, heads (B, h, L, d_k), matmul", "Annotated Transformer (note 000)",
                  default=True),
        Component("d2l", "attention", D2LAttention,
                  "W_q/W_k/W_v/W_o, heads folded into batch (B*h, L, d_k), bmm", "d2l §10.5 (notes 001, 003)"),
        Component("torch", "attention", TorchSDPAttention,
                  "projections + F.scaled_dot_product_attention", "PyTorch SDPA"),
        Component("happy_llm", "attention", HappyLLMAttention,
                  "wq/wk/wv/wo, float32 softmax, residual dropout", "happy-llm ch. 2 (note 002)"),
        Component("sdpa_packed", "attention", PackedSDPAttention,
                  "one packed qkv Linear (3D, D) + F.scaled_dot_product_attention", "nanoGPT c_attn; timm Attention"),
    ]
