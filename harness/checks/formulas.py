"""Independent reference formulas for components that declare a difference from their slot's default
(``Component(differs=..., reference="NAME")``): each written from its paper in float64, never from
a component's code, and the known ways real code gets them wrong.

Shape letters: B batch, H heads, L length, Tq/Tk query/key length, D = d_model, d_k = D / H.

Sources: Su et al. 2021 (RoFormer, eq. 34 and its complex form, eq. 12); Press et al. 2022 (ALiBi §3);
Zhang & Sennrich 2019 (RMSNorm, eq. 4); Ioffe & Szegedy 2015 (BatchNorm, Algorithm 1-2); Shazeer 2020
(GLU variants, eq. 5-6); Hendrycks & Gimpel 2016 (GELU); GPT-2 / BERT (learned absolute positions).
"""
from __future__ import annotations

import math

import torch

from .policy import ALIBI_ATOL, ALIBI_RTOL, ALIBI_SLOPE_ATOL, ALIBI_SLOPE_RTOL

#: slot -> formula name -> what it computes (the names a ``Component(reference=...)`` may give).
FORMULAS: dict[str, dict[str, str]] = {
    "positional": {
        "learned_absolute": "x * sqrt(d_model) + weight[:L], weight the canonical (max_len, D) table (GPT-2, BERT)",
        "unscaled_pe": "x + PE[:L]: Vaswani et al. 2017 §3.4-3.5 without the sqrt(d_model) scale of the "
                               "embeddings (the sinusoidal table unchanged)",
        "no_positions": "x * sqrt(d_model): the embeddings' scale alone, no positional encoding and nothing added "
                        "inside attention (Vaswani et al. 2017 §3.4 without §3.5)",
        "rotary": "x * sqrt(d_model) on the embeddings; in self-attention each head's q and k rotated as complex "
                "pairs (x_2i + i x_2i+1) * exp(i pos theta_i), theta_i = 10000^(-2i/d_k) (RoFormer eq. 12/34)",
        "linear_biases": "x * sqrt(d_model) on the embeddings; -m_h |i - j| added to head h's scaled scores; for H a "
                 "power of 2, m_h = 2^(-8h/H), h = 1..H (the geometric sequence from 2^(-8/H) with ratio 2^(-8/H)); "
                 "otherwise, with n the power of 2 below H, the n slopes for n heads followed by the 1st, 3rd, 5th, "
                 "... slopes for 2n heads until H slopes (Press et al. 2022 §3 and its code)",
    },
    "layer_norm": {
        "rms_norm": "a / RMS(a) * g with RMS(a) = sqrt(mean(a^2) + 1e-6), no mean, no bias (Zhang & Sennrich 2019 "
                   "eq. 4)",
        "batch_norm": "training: each feature d of the B * L rows (x - mean_d) / sqrt(var_d + 1e-5) * g + b with "
                      "the batch's mean and biased variance over all rows; running_mean, running_var <- 0.9 * "
                      "themselves + 0.1 * (mean_d, unbiased var_d); evaluation: the running statistics in their "
                      "place (Ioffe & Szegedy 2015, Algorithm 1-2; nn.BatchNorm1d)",
    },
    "feed_forward": {
        "ffn_relu": "max(0, x W_1 + b_1) W_2 + b_2 (Vaswani et al. 2017 eq. 2)",
        "ffn_gelu": "GELU(x W_1 + b_1) W_2 + b_2, GELU(u) = u Phi(u) = u (1 + erf(u / sqrt 2)) / 2 (Hendrycks & "
                "Gimpel 2016)",
        "ffn_swiglu": "(Swish_1(x W) * x V) W_2, Swish_1(u) = u sigmoid(u); W = w_gate, V = w_up, W_2 = w_down "
                  "(Shazeer 2020 eq. 6)",
        "ffn_geglu": "(GELU(x W) * x V) W_2; W = w_gate, V = w_up, W_2 = w_down (Shazeer 2020 eq. 6)",
    },
}

FORMULAS["attention"] = {
    "qk_rmsnorm": "scaled dot-product attention with QK-norm: each head's q and k RMS-normalised over d_k (eps 1e-6) "
                  "times learned gains q_norm.weight, k_norm.weight (d_k,), after the head split and before RoPE "
                  "(Gemma 3, Qwen3 q_norm / k_norm; Dehghani et al. 2023 normalise q and k with LayerNorm; OLMo 2 normalises "
                  "the whole projection before the head split, another formula)",
}
FORMULAS["norm"] = {
    "parallel_block": "parallel block (class attribute parallel = True): x + sum_i sublayer_i(LayerNorm(x)) over all "
                      "the layer's sub-layers, one LayerNorm, outputs summed into the residual; final_norm = True "
                      "(GPT-J; PaLM §2 'Parallel Layers': y = x + MLP(LN(x)) + Attention(LN(x)))",
}
FORMULAS["mask"] = {
    "causal_window": "causal with a window of w keys (ModelConfig.sliding_window()): query i attends to the real "
                      "keys j with i - w < j <= i, itself included (Mistral, Jiang et al. 2023; HF Mistral's mask "
                      "j > i - sliding_window); the source padding mask unchanged",
}


def window_keep(t: int, w: int, fault: str = "") -> torch.Tensor:
    """(T, T) bool: the sliding-window causal keep-mask, i - w < j <= i (or as ``fault`` of
    :data:`WINDOW_FAULTS` makes it)."""
    i = torch.arange(t)[:, None]
    j = torch.arange(t)[None, :]
    if fault == "two_sided":
        return (i - j).abs() < w
    width = {"one_more": w + 1, "one_less": w - 1, "no_window": t + 1}.get(fault, w)
    return (j <= i) & (i - j < width)


#: Known sliding-window mistakes -> what the check prints.
WINDOW_FAULTS = {
    "one_more": "a window of w + 1 keys (i - w <= j <= i: 'positions between i - W and i' read inclusively) where "
                "the window holds w keys, itself included (j > i - w)",
    "one_less": "a window of w - 1 keys (itself not counted in w) where the window holds w keys, itself included",
    "no_window": "no window: plain causal attention (every earlier key kept)",
    "two_sided": "a two-sided window |i - j| < w (Longformer's local attention) where the sliding window is causal",
}


#: gated formulas: canonical ``w_gate``, ``w_up`` (inner, D) and ``w_down`` (D, inner) -- names of their own,
#: since their inner width (Shazeer's 2/3 d_ff) differs from the ReLU FFN's ``w_1`` / ``w_2``
GATED = ("ffn_swiglu", "ffn_geglu")


# --------------------------------------------------------------------------- positions

def rope_reference(x: torch.Tensor, base: float = 10000.0, dims: int | None = None, sign: float = 1.0) -> torch.Tensor:
    """RoFormer's rotation in its complex form: x (..., L, d) float64 -> the same shape, the pair
    (x_2i, x_2i+1) read as x_2i + i x_2i+1 and multiplied by exp(i * pos * theta_i),
    theta_i = base^(-2i / dims) (``dims`` = d and ``sign`` = 1 unless a fault is reproduced)."""
    d, length = x.size(-1), x.size(-2)
    dims = dims or d
    theta = torch.tensor([base ** (-2.0 * i / dims) for i in range(d // 2)], dtype=torch.float64)
    pos = torch.arange(length, dtype=torch.float64)
    turn = torch.polar(torch.ones(length, d // 2, dtype=torch.float64), torch.outer(sign * pos, theta))  # (L, d/2)
    pairs = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(pairs * turn).reshape(x.shape)


def rope_half_split(x: torch.Tensor) -> torch.Tensor:
    """The GPT-NeoX / LLaMA-HF layout (``rotate_half``): feature i paired with i + d/2, not 2i with 2i+1.
    Equals :func:`rope_reference` after permuting the features to (0, d/2, 1, d/2 + 1, ...)."""
    d = x.size(-1)
    order = torch.stack((torch.arange(d // 2), torch.arange(d // 2) + d // 2), dim=-1).flatten()  # (d,)
    inverse = torch.argsort(order)
    return rope_reference(x.double()[..., order])[..., inverse]


def alibi_slopes_reference(h: int) -> torch.Tensor:
    """(H,) Press et al. 2022 §3: "a geometric sequence that starts at 2^(-8/n) and uses that same value
    as its ratio" for n heads a power of 2; otherwise the slopes of the closest power of 2 below,
    then every other slope of the sequence for twice that (the paper's footnote, its code)."""
    def geometric(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start * start ** i for i in range(n)]

    if h & (h - 1) == 0:
        return torch.tensor(geometric(h), dtype=torch.float64)
    low = 1 << (h.bit_length() - 1)
    return torch.tensor(geometric(low) + geometric(2 * low)[::2][: h - low], dtype=torch.float64)


def alibi_reference(h: int, tq: int, tk: int, slopes: torch.Tensor | None = None) -> torch.Tensor:
    """(H, Tq, Tk) float64: -m_h * |i - j| (the paper's causal -m (i - j) for j <= i, symmetric beyond)."""
    slopes = alibi_slopes_reference(h) if slopes is None else slopes
    dist = (torch.arange(tq, dtype=torch.float64)[:, None] - torch.arange(tk, dtype=torch.float64)[None, :]).abs()
    return -slopes[:, None, None] * dist


def alibi_faults(h: int, tq: int, tk: int) -> dict[str, torch.Tensor]:
    """Known ALiBi mistakes -> their (H, Tq, Tk) bias: slopes for another number of heads, reversed
    slopes, the sign flipped, no bias."""
    out = {}
    for n in sorted({1, 2, 4, 8, 16, 32, 2 * h, h + 1, max(1, h - 1), max(1, h // 2)} - {h}):
        slopes = alibi_slopes_reference(n)
        if n >= h:
            out[f"ALiBi slopes computed for {n} heads instead of h = {h} (m = 2^(-8i/{n}), the first {h} used)"] = \
                alibi_reference(h, tq, tk, slopes[:h])
    out["ALiBi slopes in reverse order (head 0 gets the smallest slope)"] = \
        alibi_reference(h, tq, tk, alibi_slopes_reference(h).flip(0))
    if h & (h - 1):
        plain = torch.tensor([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)], dtype=torch.float64)
        out[f"ALiBi slopes 2^(-8i/h) for h = {h}, not a power of 2: the paper takes the {1 << (h.bit_length() - 1)} "
            f"slopes of the power of 2 below, then every other slope for {2 << (h.bit_length() - 1)} heads"] = \
            alibi_reference(h, tq, tk, plain)
    linear = torch.arange(1, h + 1, dtype=torch.float64) / h
    out["ALiBi slopes linear in the head index (m_h = h / H) where the paper's are geometric (2^(-8/H), "
        "2^(-16/H), ...)"] = alibi_reference(h, tq, tk, linear)
    out["ALiBi slopes 1/2, 1/4, 1/8, ... (ratio 1/2 whatever H) where the paper's ratio is 2^(-8/H)"] = \
        alibi_reference(h, tq, tk, torch.tensor([2.0 ** -(i + 1) for i in range(h)], dtype=torch.float64))
    signed = torch.arange(tq, dtype=torch.float64)[:, None] - torch.arange(tk, dtype=torch.float64)[None, :]
    out["ALiBi bias on the signed distance -m (i - j) instead of -m |i - j| (keys after the query rewarded)"] = \
        -alibi_slopes_reference(h)[:, None, None] * signed
    out["ALiBi bias added with the wrong sign (+m |i - j|: distant keys rewarded)"] = -alibi_reference(h, tq, tk)
    out["no ALiBi bias reaches the scores"] = torch.zeros(h, tq, tk, dtype=torch.float64)
    return out


def rope_faults(q: torch.Tensor, k: torch.Tensor, d_model: int) -> dict[str, torch.Tensor]:
    """Known RoPE mistakes -> the scores (..., Lq, Lk) they give on q, k (..., L, d_k)."""
    def scores(fq, fk):
        return fq @ fk.transpose(-2, -1)

    d_k = q.size(-1)
    return {
        "RoPE in the half-split layout (GPT-NeoX / LLaMA-HF rotate_half) where the paper's interleaved pairs "
        "(2i, 2i+1) are meant: the same function only after permuting the rows of W_q and W_k within each head "
        "(a weight-conversion bug); rotate interleaved pairs, or declare the permutation with qk_order()":
            scores(rope_half_split(q), rope_half_split(k)),
        f"RoPE frequencies computed over d_model = {d_model} instead of d_k = {d_k}":
            scores(rope_reference(q, dims=d_model), rope_reference(k, dims=d_model)),
        "RoPE rotates by -pos * theta (sin sign flipped)":
            scores(rope_reference(q, sign=-1.0), rope_reference(k, sign=-1.0)),
        "RoPE applied to q only (k not rotated)": scores(rope_reference(q), k.double()),
        "RoPE applied to k only (q not rotated)": scores(q.double(), rope_reference(k)),
        "RoPE exponent -i/d_k instead of -2i/d_k (theta_i = 10000^(-i/d_k): the factor 2 missing)":
            scores(rope_reference(q, dims=2 * d_k), rope_reference(k, dims=2 * d_k)),
        **{f"RoPE base {base:g} instead of 10000 (theta_i = {base:g}^(-2i/d_k))":
           scores(rope_reference(q, base=base), rope_reference(k, base=base)) for base in ROPE_BASES},
        "no rotation reaches q and k": scores(q.double(), k.double()),
    }


#: RoPE bases other code uses, tried as faults against RoFormer's 10000 (LLaMA-3: 500000; Code LLaMA: 1e6)
ROPE_BASES = (100.0, 1000.0, 100000.0, 500000.0, 1000000.0)


# --------------------------------------------------------------------------- norm (parallel block)

def alibi_slope_fault(bias: torch.Tensor) -> str:
    """What is wrong with the slopes of a score bias ``bias`` (H, L, L) that no :func:`alibi_faults` entry
    reproduces, read from the bias itself: when each head's bias is -m_h |i - j| for some slopes m_h (measured at
    distance 1), the slopes are named (one slope for every head, a geometric sequence of another start or
    ratio, or the measured values beside the paper's); "" when the bias is not of that form."""
    h, length = bias.size(0), bias.size(-1)
    if length < 3:
        return ""
    dist = (torch.arange(length, dtype=torch.float64)[:, None] - torch.arange(length, dtype=torch.float64)).abs()
    m = -bias[:, 1, 0].double()  # (H,)
    if (not torch.allclose(bias.double(), -m[:, None, None] * dist, rtol=ALIBI_RTOL, atol=ALIBI_ATOL)
            or not (m > 0).all()):
        return ""
    paper = alibi_slopes_reference(h)
    shown = ", ".join(f"{v:.3g}" for v in m.tolist()[:4]) + (", ..." if h > 4 else "")
    want = f"the paper's geometric {', '.join(f'{v:.3g}' for v in paper.tolist()[:4])}{', ...' if h > 4 else ''}"
    if h > 1 and torch.allclose(m, m[0].expand(h), rtol=ALIBI_SLOPE_RTOL):
        named = " = 1/H" if abs(float(m[0]) - 1.0 / h) < ALIBI_SLOPE_ATOL else ""
        return f"ALiBi: one slope m = {float(m[0]):.3g}{named} for every head where the slopes are {want} (one per head)"
    ratios = m[1:] / m[:-1]
    if h > 2 and torch.allclose(ratios, ratios[0].expand(h - 1), rtol=ALIBI_SLOPE_RTOL):
        return (f"ALiBi slopes geometric from {float(m[0]):.3g} with ratio {float(ratios[0]):.3g} where the paper's "
                f"start and ratio are 2^(-8/H) = {float(paper[0]):.3g} (H = {h})")
    return f"ALiBi slopes {shown} (measured at distance 1) where the slopes are {want}"


def parallel_reference(x: torch.Tensor, subs: list, ln) -> torch.Tensor:
    """PaLM §2 / GPT-J: x + sum_i f_i(LN(x)); x (B, L, D), ``subs`` callables (B, L, D) -> (B, L, D),
    ``ln`` the block's LayerNorm."""
    y = ln(x)
    return x + sum(f(y) for f in subs)


def parallel_faults(x: torch.Tensor, subs: list, ln) -> dict[str, torch.Tensor]:
    """Known parallel-block mistakes -> their output (B, L, D), for ``subs`` of 2 or more sub-layers."""
    seq = x
    for f in subs:
        seq = seq + f(ln(seq))
    y = ln(x)
    first = subs[0](y)
    out = {
        "sequential pre-norm: each sub-layer reads LayerNorm of the previous one's residual output "
        "(x + f_1(LN(x)), then + f_2(LN(...))) instead of all reading the same LayerNorm(x)": seq,
        "the FFN applied to the attention output (x + a + f_2(a), a = f_1(LN(x))) instead of to LayerNorm(x)":
            x + first + sum(f(first) for f in subs[1:]),
        "the residual x dropped: sum_i f_i(LN(x)) without x": sum(f(y) for f in subs),
        "the sub-layers read x, not LayerNorm(x): x + sum_i f_i(x)": x + sum(f(x) for f in subs),
        "post-norm of the sum: LayerNorm(x + sum_i f_i(x))": ln(x + sum(f(x) for f in subs)),
        "the sub-layers' outputs averaged, not summed: x + mean_i f_i(LN(x))": x + sum(f(y) for f in subs) / len(subs),
        "only the first sub-layer (attention) reaches the output: x + f_1(LN(x))": x + first,
        "the last sub-layer (FFN) alone reaches the output: x + f_n(LN(x))": x + subs[-1](y),
    }
    if len(subs) > 2:
        out["only the first two sub-layers summed (a block written for the encoder's two: the decoder's third, "
            "the FFN, dropped)"] = x + first + subs[1](y)
    return out


# --------------------------------------------------------------------------- layer_norm

def rmsnorm_reference(x: torch.Tensor, g: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Zhang & Sennrich 2019 eq. 4: a_i / RMS(a) * g_i, RMS(a) = sqrt(1/n sum a_i^2 + eps)."""
    x = x.double()
    rms = (x.pow(2).sum(-1, keepdim=True) / x.size(-1) + eps).sqrt()
    return x / rms * g.double()


def rmsnorm_faults(x: torch.Tensor, g: torch.Tensor) -> dict[str, torch.Tensor]:
    """Known RMSNorm mistakes -> their output (..., D), on x (..., D) with gain g (D,)."""
    x, g = x.double(), g.double()
    ms = x.pow(2).mean(-1, keepdim=True)
    centred = x - x.mean(-1, keepdim=True)
    return {
        "with the mean subtracted (a LayerNorm without bias)":
            centred / (centred.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * g,
        "eps added outside the square root: a / (sqrt(mean(a^2)) + eps)": x / (ms.sqrt() + 1e-6) * g,
        "the sum of squares where the mean is meant: a / sqrt(sum(a^2) + eps)":
            x / (x.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt() * g,
        "divided by mean(a^2) without the square root": x / (ms + 1e-6) * g,
        "the gain g not applied": x / (ms + 1e-6).sqrt(),
    }


def batchnorm_reference(x: torch.Tensor, g: torch.Tensor, b: torch.Tensor,
                        eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor]:
    """Ioffe & Szegedy 2015, Algorithm 1-2, over the rows of x (..., D) flattened to (n, D):
    ``(training output (..., D), evaluation output (..., D))``, the latter with the running statistics
    after this one training batch from mean 0 and variance 1 (momentum 0.1, unbiased variance)."""
    x, g, b = x.double(), g.double(), b.double()
    rows = x.reshape(-1, x.size(-1))
    mean, var = rows.mean(0), rows.var(0, unbiased=False)
    train = (x - mean) / (var + eps).sqrt() * g + b
    run_mean, run_var = 0.1 * mean, 0.9 + 0.1 * rows.var(0, unbiased=True)
    return train, (x - run_mean) / (run_var + eps).sqrt() * g + b


def batchnorm_faults(x: torch.Tensor, g: torch.Tensor, b: torch.Tensor) -> dict[str, torch.Tensor]:
    """Known BatchNorm-in-a-Transformer mistakes -> their training output (..., D), on x (B, L, D)."""
    x, g, b = x.double(), g.double(), b.double()
    per_pos_mean, per_pos_var = x.mean(0), x.var(0, unbiased=False)  # (L, D)
    per_row = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    rows = x.reshape(-1, x.size(-1))
    return {
        "statistics per position (over the batch only) instead of over every (batch, position) row":
            (x - per_pos_mean) / (per_pos_var + 1e-5).sqrt() * g + b,
        "statistics over d_model per row: a LayerNorm, not a BatchNorm":
            (x - per_row[0]) / (per_row[1] + 1e-5).sqrt() * g + b,
        "the unbiased variance in the normalisation (BatchNorm uses the biased one there)":
            (x - rows.mean(0)) / (rows.var(0, unbiased=True) + 1e-5).sqrt() * g + b,
    }


# --------------------------------------------------------------------------- feed_forward

def _gelu(u: torch.Tensor) -> torch.Tensor:
    return u * (1.0 + torch.erf(u / math.sqrt(2.0))) / 2.0


def _swish(u: torch.Tensor) -> torch.Tensor:
    return u * torch.sigmoid(u)


def _lin(x: torch.Tensor, state: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    y = x.double() @ state[f"{name}.weight"].double().T
    bias = state.get(f"{name}.bias")
    return y if bias is None else y + bias.double()


def ffn_reference(formula: str, x: torch.Tensor, state: dict[str, torch.Tensor], gate: str = "w_gate",
                  up: str = "w_up", act: str | None = None) -> torch.Tensor:
    """The feed-forward ``formula`` (:data:`FORMULAS`) on x (..., D) with canonical ``state``; ``gate`` /
    ``up`` / ``act`` only change for the faults (:func:`ffn_faults`)."""
    acts = {"ffn_relu": torch.relu, "ffn_gelu": _gelu, "ffn_swiglu": _swish, "ffn_geglu": _gelu,
            "identity": lambda u: u}
    f = acts[act or formula]
    if formula in GATED:
        return _lin(f(_lin(x, state, gate)) * _lin(x, state, up), state, "w_down")
    return _lin(f(_lin(x, state, "w_1")), state, "w_2")


def ffn_faults(formula: str, x: torch.Tensor, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Known feed-forward mistakes -> their output (..., D)."""
    out = {}
    if formula in GATED:
        out["gate and up projections swapped (the activation applied to x w_up instead of x w_gate): the same "
            "function only after relabelling w_gate <-> w_up, so weights under the canonical names (a LLaMA "
            "checkpoint's gate_proj / up_proj) give another function; export the gated projection as w_gate"] = \
            ffn_reference(formula, x, state, gate="w_up", up="w_gate")
        other = "ffn_geglu" if formula == "ffn_swiglu" else "ffn_swiglu"
        names = {"ffn_swiglu": "SiLU/Swish", "ffn_geglu": "GELU"}
        out[f"a {names[other]} gate where {formula} means {names[formula]}"] = \
            ffn_reference(formula, x, state, act=other)
        out[f"no activation on the gate (x W * x V, a bilinear layer) where {formula} applies {names[formula]} to "
            f"x W"] = ffn_reference(formula, x, state, act="identity")
        out[f"a ReLU gate (ReGLU) where {formula} means {names[formula]}"] = \
            ffn_reference(formula, x, state, act="ffn_relu")
    else:
        for other in ("ffn_relu", "ffn_gelu"):
            if other != formula:
                out[f"{other[4:].upper()} where {formula[4:].upper()} is meant"] = \
                    ffn_reference(formula, x, state, act=other)
        out["no activation between w_1 and w_2 (two linear maps)"] = ffn_reference(formula, x, state, act="identity")
        if formula == "ffn_gelu":
            u = _lin(x, state, "w_1")
            approx = 0.5 * u * (1 + torch.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u ** 3)))
            out["the tanh approximation of GELU where the exact (erf) GELU is meant"] = _lin(approx, state, "w_2")
    return out
