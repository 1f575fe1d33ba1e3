"""Analytic training FLOPs, the one place they are counted (compare, benchmarks, model sizing).

Convention (Kaplan et al. 2020; as the paper's code logs them): a matmul weight applied at one
position costs 2 FLOPs forward and 4 backward, so training costs 6 x (matmul parameters) per
position; embedding lookups and norms are free. Causal attention adds, per layer and query,
12 x d x (keys attended): QK^T and AV are 2 d FLOPs per key each forward, tripled for backward.
Only the keys a query may see count (what a kernel that skips masked blocks would do).

Per byte:

* U-Net:  6 (N_byte + r N_main) + 12 d [L_byte keys(S, window) + r L_main keys(r S)]
  with N_byte the encoder, decoder, both heads and the boundary module, N_main the main network,
  r the achieved rate (chunks per byte) and S the sequence length in bytes.
* two-stage U-Net (model.stages=2), with r2 the inner stage's rate (inner chunks per outer chunk):
  6 (N_byte + r N_stage + r r2 N_main) + 2 N_dec + 12 d [L_byte keys(S, window)
  + r L_stage keys(r S) + r r2 L_main keys(r r2 S)] + 4 d L_dec keys(S, window), N_stage / L_stage
  the inner encoder, decoder and router; N_dec / L_dec the byte decoder and head, run a second
  time in training, forward only, on the exit that skips the inner stage (the inner router's
  reward baseline). Deeper U-Nets: each level k >= 1 at density c_{k-1} = r r2 ... (its input's
  chunks per byte), the main network at the innermost density, and level k's skip exit through
  the decoders of levels k - 1 .. 0.
* bytes:  6 N + 12 d L keys(S, window).
* bpe-lm: r_tok [6 N + 12 d L keys(r_tok S)], N including the vocabulary head, r_tok tokens/byte.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass
from typing import Sequence

from torch import nn

from .schema import RunConfig

ATTN_FLOPS_PER_KEY_DIM = 12  # (QK^T + AV) x 2 FLOPs per multiply-add x 3 (forward + backward)


def mean_causal_keys(n: float, window: int | None = None) -> float:
    """Average number of keys per query for causal attention over n queries (each sees itself and
    up to ``window`` - 1 earlier positions)."""
    if n <= 0:
        return 0.0
    if window is None or window >= n:
        return (n + 1) / 2
    W = window
    return (W * (W + 1) / 2 + (n - W) * W) / n


@dataclass
class FlopCount:
    per_byte: float  # training FLOPs per byte of data
    matmul_per_byte: float
    attention_per_byte: float
    rate: float  # chunks (U-Net) or tokens (bpe-lm) per byte used; 1 for flat byte models
    params_per_byte: int  # matmul parameters applied at every byte
    params_per_chunk: int  # matmul parameters applied at every chunk / token
    inner_rate: float | None = None  # two stages: inner chunks per outer chunk used
    params_per_inner_chunk: int = 0  # two stages: the innermost main network's matmul parameters
    frozen_per_byte: float = 0.0  # a frozen LM run forward only on every byte (entropy patching)

    def total(self, n_bytes: float) -> float:
        return self.per_byte * n_bytes

    def to_dict(self) -> dict:
        return asdict(self)


def _matmul_params(mods) -> int:
    return sum(p.numel() for m in mods for _, p in m.named_parameters() if p.dim() >= 2)


def unet_flops(model: nn.Module, cfg: RunConfig, rate: float,
               inner_rate: float | Sequence[float] | None = None) -> FlopCount:
    """``inner_rate`` (two levels or more): each deeper level's chunks per chunk of the level above
    (one value for every level, or one per level, level 1 first); default its target."""
    mc = cfg.model
    d, S = mc.d_model, mc.seq_len
    stages = model.stage.stages
    top = stages[0]
    # a shared head is applied twice per byte (early exit and final prediction)
    heads = [model.head, model.head] if model.cfg.shared_head else [model.head, model.early_head]
    frozen = top.router.forward_only_lms()
    per_byte = _matmul_params([*top.encoder, *top.decoder, *heads, top.router]) - _matmul_params(frozen)
    # a frozen LM in the router runs forward only on every byte: a third of its training FLOPs
    fwd = sum(flat_flops(m, S).per_byte for m in frozen) / 3
    n_byte_layers = len(top.encoder) + len(top.decoder)
    main = top.main.layers
    if len(stages) == 1:
        per_chunk = _matmul_params(list(main))
        matmul = 6 * (per_byte + rate * per_chunk)
        attn = ATTN_FLOPS_PER_KEY_DIM * d * (n_byte_layers * mean_causal_keys(S, mc.window)
                                            + rate * len(main) * mean_causal_keys(rate * S))
        return FlopCount(matmul + attn + fwd, matmul, attn, rate, per_byte, per_chunk, frozen_per_byte=fwd)
    deeper = len(stages) - 1
    if inner_rate is None:
        inner_rate = cfg.boundary.inner_target_rate
    rates = [float(inner_rate)] * deeper if isinstance(inner_rate, (int, float)) else [float(r) for r in inner_rate]
    per_stage = [_matmul_params([*st.encoder, *st.decoder, st.router]) for st in stages[1:]]
    per_inner = _matmul_params(list(main))
    # density[k]: chunks of level k per byte (level 0's chunks: the rate)
    density = [rate]
    for r in rates:
        density.append(density[-1] * r)
    matmul = 6 * (per_byte + sum(density[k] * per_stage[k] for k in range(deeper)) + density[-1] * per_inner)
    attn_keys = sum(density[k] * (len(stages[k + 1].encoder) + len(stages[k + 1].decoder))
                    * mean_causal_keys(density[k] * S) for k in range(deeper))
    attn_keys += density[-1] * len(main) * mean_causal_keys(density[-1] * S)
    # the skip exits (boundary.inner_baseline=skip), training only, forward only (2 per weight, a
    # third of attention's 12): level k's runs the decoders of levels k - 1 .. 0 and the head
    skip_pass = getattr(cfg.boundary, "inner_baseline", "skip") == "skip"
    skip, skip_keys = 0.0, 0.0
    if skip_pass:
        for k in range(1, deeper + 1):
            skip += _matmul_params([*top.decoder, model.head])
            skip_keys += len(top.decoder) / 3 * mean_causal_keys(S, mc.window)
            for j in range(1, k):
                skip += density[j - 1] * _matmul_params(list(stages[j].decoder))
                skip_keys += density[j - 1] * len(stages[j].decoder) / 3 * mean_causal_keys(density[j - 1] * S)
    matmul = matmul + 2 * skip
    attn = ATTN_FLOPS_PER_KEY_DIM * d * (n_byte_layers * mean_causal_keys(S, mc.window) + skip_keys + attn_keys)
    return FlopCount(matmul + attn, matmul, attn, rate, per_byte, per_stage[0], rates[0], per_inner)


def flat_flops(model: nn.Module, seq_len: int, token_rate: float | None = None) -> FlopCount:
    """A FlatLM over bytes (``token_rate`` None) or over tokens, ``token_rate`` per byte."""
    n = _matmul_params([*model.blocks, model.head])
    rate = 1.0 if token_rate is None else token_rate
    keys = mean_causal_keys(rate * seq_len, model.window)
    matmul = rate * 6 * n
    attn = rate * ATTN_FLOPS_PER_KEY_DIM * model.d_model * len(model.blocks) * keys
    if token_rate is None:
        return FlopCount(matmul + attn, matmul, attn, rate, n, 0)
    return FlopCount(matmul + attn, matmul, attn, rate, 0, n)


@functools.singledispatch
def training_flops_per_byte(model: nn.Module, cfg: RunConfig, rate: float | None = None,
                            inner_rate: float | None = None) -> FlopCount:
    """FLOPs per training byte of a built model. ``rate``: achieved chunks (or tokens) per byte,
    default the target rate; ``inner_rate``: a two-stage U-Net's achieved inner rate (default its
    target). The U-Net's count; a flat baseline registers its own for its model class
    (rltok/flat/: the bytes LM ignores ``rate``, the token LM reads it as tokens per byte)."""
    return unet_flops(model, cfg, cfg.boundary.target_rate if rate is None else rate, inner_rate)


def solve_hidden(budget: float, fixed: float, per_hidden: float, lo: int = 1) -> int:
    """The integer MLP width h >= lo with fixed + per_hidden * h closest to budget."""
    if per_hidden <= 0:
        return lo
    return max(lo, int(round((budget - fixed) / per_hidden)))


def format_flops(x: float) -> str:
    if not math.isfinite(x):
        return "n/a"
    for unit, scale in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"
