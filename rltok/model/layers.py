"""Transformer building blocks: RMSNorm, RoPE at arbitrary integer positions, causal attention
(full or sliding-window), gated MLP, pre-norm block.

Positions are integer byte positions; rotary angles are computed in float32 (exact for positions
below 2**24), unlike the reference code, which built positions in bf16 (spec section 1.5).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..syncs import accelerator_path


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope_angles(positions: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos/sin for integer positions of shape (..., T) -> (..., 1, T, head_dim/2), float32.

    The head axis is inserted before T so the result broadcasts against (B, H, T, hd/2).
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device,
                                             dtype=torch.float32) / head_dim))
    ang = positions.to(torch.float32)[..., None] * inv_freq  # (..., T, hd/2)
    return ang.cos().unsqueeze(-3), ang.sin().unsqueeze(-3)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate-half RoPE on x of shape (B, H, T, hd)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    out = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return out.to(x.dtype)


def _band_mask(window: int, device: torch.device) -> Tensor:
    """Mask for blocked local attention: queries of block n (W of them) against the keys of
    blocks n-1 and n (2W). Query i may see key j iff i < j <= i + W, i.e. the W most recent
    positions including itself."""
    i = torch.arange(window, device=device)[:, None]
    j = torch.arange(2 * window, device=device)[None, :]
    return (j > i) & (j <= i + window)


def explicit_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """softmax(q k^T / sqrt(hd), masked) v with the two matmuls in the inputs' dtype and the
    softmax in float32. ``mask`` (bool) broadcasts against the scores (..., Tq, Tk).

    The CPU path: with a mask, SDPA on the CPU runs its math kernel in float32 (a bf16 input is
    upcast, so both matmuls run at the float32 rate), and its flash kernel is slow at short
    lengths (the main network's ~100 chunks). In bf16 this rounds the scores to bf16 before the
    softmax, as any unfused bf16 attention does (max error on unit-variance inputs of the order
    of the flash kernel's; tests/test_layers.py)."""
    scale = q.shape[-1] ** -0.5
    s = q @ k.transpose(-1, -2)
    p = torch.softmax(torch.where(mask, s.float() * scale, float("-inf")), dim=-1)
    return p.to(v.dtype) @ v


def _blocks_for_local(q: Tensor, k: Tensor, v: Tensor, window: int):
    """q as (B*H, nb, W, hd) blocks, keys/values of the previous and the current block
    (B*H, nb, 2W, hd), and the band mask (nb, W, 2W)."""
    B, H, T, hd = q.shape
    W = window
    nb = -(-T // W)
    pad = nb * W - T
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    qb = q.reshape(B * H, nb, W, hd)
    kb = k.reshape(B * H, nb, W, hd)
    vb = v.reshape(B * H, nb, W, hd)
    k2 = torch.cat([F.pad(kb, (0, 0, 0, 0, 1, 0))[:, :-1], kb], dim=2)  # (B*H, nb, 2W, hd)
    v2 = torch.cat([F.pad(vb, (0, 0, 0, 0, 1, 0))[:, :-1], vb], dim=2)
    mask = _band_mask(W, q.device).expand(nb, W, 2 * W).clone()
    mask[0, :, :W] = False  # block 0 has no previous block
    return qb, k2, v2, mask


def local_attention(q: Tensor, k: Tensor, v: Tensor, window: int, impl: str = "sdpa") -> Tensor:
    """Exact causal sliding-window attention in O(T * window), on blocks of ``window`` queries.

    q, k, v: (B, H, T, hd). Each query at t attends keys t-window+1 .. t. ``impl``: ``sdpa``
    (the fused kernels where the device has them) or ``explicit`` (:func:`explicit_attention`).
    """
    B, H, T, hd = q.shape
    qb, k2, v2, mask = _blocks_for_local(q, k, v, window)
    if impl == "explicit":
        out = explicit_attention(qb, k2, v2, mask)
    else:
        # 4-D (batch*heads, blocks, ...): the fused SDPA kernels take 4-D inputs only (5-D falls
        # back to the unfused math kernel on CUDA); the mask broadcasts over the first axis
        out = F.scaled_dot_product_attention(qb, k2, v2, attn_mask=mask)
    out = out.reshape(B, H, -1, hd)
    return out[:, :, :T] if out.shape[2] != T else out


def causal_attention(q: Tensor, k: Tensor, v: Tensor, impl: str = "sdpa") -> Tensor:
    """Full causal attention, (B, H, T, hd)."""
    if impl == "explicit":
        T = q.shape[-2]
        mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        return explicit_attention(q, k, v, mask)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


# the explicit path is used on the CPU up to this many keys per query (its scores are
# materialised: B*H*T*T floats for full attention)
EXPLICIT_MAX_KEYS = 2048


def attention_impl(q: Tensor, n_keys: int) -> str:
    """``explicit`` on the CPU (faster there, see :func:`explicit_attention`), ``sdpa``
    elsewhere. RLTOK_ATTENTION=sdpa forces SDPA everywhere."""
    if os.environ.get("RLTOK_ATTENTION", "auto") == "sdpa" or accelerator_path(q.device):
        return "sdpa"
    return "explicit" if n_keys <= EXPLICIT_MAX_KEYS else "sdpa"


@dataclass
class KVCache:
    """Keys and values of one attention layer, for incremental decoding (one row per sequence).

    Two kinds, one attention rule (a query sees every slot whose ``pos`` is >= 0):

    * ring (``window`` = W, the byte layers): W slots, position t lives in slot t mod W, so the
      slots always hold the W most recent positions, exactly the keys the sliding window sees.
      Memory is bounded by the window, not by the number of bytes.
    * growing (``window`` None, the main network over chunks): entry n of a row lives in slot n;
      rows are ragged (``length`` per row) and the capacity doubles when a row runs out. Memory is
      bounded by the chunk count.
    """

    k: Tensor  # (B, H, C, hd)
    v: Tensor  # (B, H, C, hd)
    pos: Tensor  # (B, C) long: the position held by each slot; -1 = empty
    length: Tensor  # (B,) long: entries written per row
    window: int | None

    @classmethod
    def from_prefill(cls, k: Tensor, v: Tensor, positions: Tensor, length: Tensor,
                     window: int | None, reserve: int = 0) -> "KVCache":
        """A cache holding the first ``length[b]`` entries of each row of k, v (B, H, T, hd)
        computed by a full forward pass; ``positions`` (B, T) are their positions (increasing
        along each row). Growing caches get room for ``reserve`` more entries."""
        B, H, T, hd = k.shape
        dev = k.device
        if window is not None:
            # slot j holds the newest entry n < length with n = j (mod W); for byte layers the
            # entry index is the position, so this is position mod W
            j = torch.arange(window, device=dev)[None, :]
            n = j + window * torch.div(length[:, None] - 1 - j, window, rounding_mode="floor")
            ok = n >= 0
            idx = n.clamp(0, max(T - 1, 0))
        else:
            cap = max(1, int(length.max().item()) + reserve)
            n = torch.arange(cap, device=dev)[None, :].expand(B, cap)
            ok = n < length[:, None]
            idx = n.clamp(max=max(T - 1, 0))
        gi = idx[:, None, :, None].expand(B, H, idx.shape[1], hd)
        mk = ok[:, None, :, None].to(k.dtype)
        return cls(k=k.gather(2, gi) * mk, v=v.gather(2, gi) * mk,
                   pos=torch.where(ok, positions.gather(1, idx), torch.full_like(idx, -1)),
                   length=length.clone(), window=window)

    @classmethod
    def empty(cls, batch: int, n_heads: int, head_dim: int, window: int | None, capacity: int = 16,
              device=None, dtype=torch.float32) -> "KVCache":
        C = window if window is not None else capacity
        z = torch.zeros(batch, n_heads, C, head_dim, device=device, dtype=dtype)
        return cls(k=z, v=z.clone(), pos=torch.full((batch, C), -1, dtype=torch.long, device=device),
                   length=torch.zeros(batch, dtype=torch.long, device=device), window=window)

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v, self.pos, self.length))

    def write(self, k: Tensor, v: Tensor, pos: Tensor, rows: Tensor | None = None) -> None:
        """Append one entry per row: k, v (n, H, hd) at positions ``pos`` (n,) for ``rows`` (n,)
        (all rows when None). In place."""
        if rows is None:
            rows = torch.arange(k.shape[0], device=k.device)
        if self.window is not None:
            slot = pos % self.window
        else:
            slot = self.length[rows]
            need = int(slot.max().item()) + 1 if slot.numel() else 0
            if need > self.capacity:
                self._grow(max(need, 2 * self.capacity))
        self.k[rows, :, slot] = k.to(self.k.dtype)
        self.v[rows, :, slot] = v.to(self.v.dtype)
        self.pos[rows, slot] = pos
        self.length[rows] += 1

    def _grow(self, capacity: int) -> None:
        extra = capacity - self.capacity
        self.k = F.pad(self.k, (0, 0, 0, extra))
        self.v = F.pad(self.v, (0, 0, 0, extra))
        self.pos = F.pad(self.pos, (0, extra), value=-1)

    def select(self, rows: Tensor) -> "KVCache":
        """The cache of a subset of rows (finished sequences dropped)."""
        return KVCache(k=self.k[rows], v=self.v[rows], pos=self.pos[rows], length=self.length[rows],
                       window=self.window)
# FlashAttention 2 (the `flash-attn` package), when installed, on CUDA in bf16/fp16: one kernel
# for full causal and for sliding-window attention. RLTOK_ATTENTION=sdpa turns it off.
try:  # pragma: no cover - not installed on CPU machines
    from flash_attn import flash_attn_func as _flash_attn_func
except Exception:  # ImportError, or a build that does not match the installed torch
    _flash_attn_func = None


def flash_available() -> bool:
    return _flash_attn_func is not None and os.environ.get("RLTOK_ATTENTION", "auto") != "sdpa"


def _use_flash(q: Tensor) -> bool:
    return flash_available() and q.is_cuda and q.dtype in (torch.bfloat16, torch.float16) and q.shape[-1] <= 256


# packed rows are padded to a multiple of this many (at tiny's ~1700 chunks per batch: <= 3.7%
# more main-network work, 1.8% on average, against 18% for the padded layout)
PACK_MULTIPLE = 64


@dataclass
class PackedRows:
    """The real rows of a right-padded (B, T) batch, packed into N = (number of real rows).

    Position-wise layers (projections, norms, MLP) run on the N packed rows only; attention
    unpacks them into the padded (B, T) layout (padding as zeros, which causal attention never
    lets a real row see) and packs its output again. The main network uses it: rows of one
    batch have different chunk counts, so the padded layout wastes ~18% of its work at a learned
    rate (uniform's exact count wastes none)."""

    index: Tensor  # (N,) long: flat indices into B * T of the real rows
    B: int
    T: int
    multiple: int  # the packed rows are padded with zero rows to a multiple of this

    static: bool = False  # index has a fixed length; its unused entries point at B * T

    @classmethod
    def of(cls, valid: Tensor, multiple: int | None = None, size: int | None = None) -> "PackedRows":
        """``size``: a static number of packed rows (no host sync: ``nonzero_static``); real rows
        beyond it are dropped (the caller detects that from the chunk counts), unused entries
        are zero rows."""
        B, T = valid.shape
        flat = valid.reshape(-1)
        if size is None:
            index, static = flat.nonzero().squeeze(1), False
        else:
            index, static = torch.nonzero_static(flat, size=size, fill_value=B * T).squeeze(1), True
        return cls(index=index, B=B, T=T, multiple=PACK_MULTIPLE if multiple is None else multiple,
                   static=static)

    def pack(self, x: Tensor) -> Tensor:
        """(B, T, ...) -> (N', ...): the real rows, then zero rows up to a multiple of
        ``multiple``, so the matmuls see few distinct shapes (the CPU's kernel cache holds one
        compiled kernel per shape)."""
        flat = x.reshape(self.B * self.T, *x.shape[2:])
        if self.static:  # one zero row for the unused entries to read
            return torch.cat([flat, flat.new_zeros(1, *flat.shape[1:])]).index_select(0, self.index)
        rows = flat.index_select(0, self.index)
        pad = -len(self.index) % self.multiple
        return torch.cat([rows, rows.new_zeros(pad, *rows.shape[1:])]) if pad else rows

    def unpack(self, x: Tensor) -> Tensor:
        """(N', ...) -> (B, T, ...), padding rows as zeros."""
        x = x[: len(self.index)]
        n = self.B * self.T + int(self.static)  # static: unused entries write to a dropped row
        out = x.new_zeros(n, *x.shape[1:]).index_copy(0, self.index, x)
        return out[: self.B * self.T].view(self.B, self.T, *x.shape[1:])


class Attention(nn.Module):
    """Multi-head causal self-attention with RoPE; ``window=None`` means full causal attention."""

    def __init__(self, dim: int, n_heads: int, window: int | None):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = dim // n_heads
        self.window = window
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)

    def project(self, x: Tensor, cos: Tensor, sin: Tensor,
                rows: PackedRows | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """q, k, v (B, H, T, hd) from x (B, T, D), or from the packed rows x (N, D)."""
        D = x.shape[-1]
        # q and k from one matmul on the first two thirds of the weight (rotated together), v
        # from its own: packed rows unpack without splitting a (N, 3D) output
        w = self.qkv.weight
        qk, v = F.linear(x, w[: 2 * D]), F.linear(x, w[2 * D:])
        if rows is not None:
            qk, v = rows.unpack(qk), rows.unpack(v)
        B, T = qk.shape[:2]
        q, k = apply_rope(qk.view(B, T, 2, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4), cos, sin)
        return q, k, v.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor,
                on_kv: Callable[[Tensor, Tensor], None] | None = None,
                rows: PackedRows | None = None) -> Tensor:
        """``on_kv(k, v)``, when given, receives the rotated keys and values (B, H, T, hd): the
        prefill of incremental decoding builds its caches from them. With ``rows``, x holds the
        packed real rows (N, D) of a padded batch and so does the output."""
        q, k, v = self.project(x, cos, sin, rows)
        B, _, T, _ = q.shape
        D = x.shape[-1]
        if on_kv is not None:
            on_kv(k, v)
        if _use_flash(q):  # (B, T, H, hd) layout; window (W-1 earlier keys, 0 later) = ours
            left = -1 if self.window is None or self.window >= T else self.window - 1
            a = _flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True,
                                 window_size=(left, 0)).reshape(B, T, D)
            return self.out(a if rows is None else rows.pack(a))
        if self.window is None or self.window >= T:
            a = causal_attention(q, k, v, attention_impl(q, T))
        else:
            a = local_attention(q, k, v, self.window, attention_impl(q, 2 * self.window))
        a = a.transpose(1, 2).reshape(B, T, D)
        return self.out(a if rows is None else rows.pack(a))

    def step(self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache, pos: Tensor,
             rows: Tensor | None = None) -> Tensor:
        """One new position per row: x (n, 1, D) at positions ``pos`` (n,), for cache ``rows``
        (n,) or all rows. Writes its key/value into the cache, then attends to the cache."""
        n, _, D = x.shape
        q, k, v = self.project(x, cos, sin)
        cache.write(k[:, :, 0], v[:, :, 0], pos, rows)
        K, V, P = (cache.k, cache.v, cache.pos) if rows is None else (cache.k[rows], cache.v[rows], cache.pos[rows])
        mask = (P >= 0)[:, None, None, :]
        a = F.scaled_dot_product_attention(q, K.to(q.dtype), V.to(q.dtype), attn_mask=mask)
        return self.out(a.transpose(1, 2).reshape(n, 1, D))


class GatedMLP(nn.Module):
    """GeGLU feed-forward (gelu-tanh gate), as in Gemma 2."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_up = nn.Linear(dim, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.gelu(gate, approximate="tanh") * up)


class Block(nn.Module):
    """Pre-norm Transformer block."""

    def __init__(self, dim: int, n_heads: int, mlp_hidden: int, window: int | None, eps: float):
        super().__init__()
        self.attn_norm = RMSNorm(dim, eps)
        self.attn = Attention(dim, n_heads, window)
        self.mlp_norm = RMSNorm(dim, eps)
        self.mlp = GatedMLP(dim, mlp_hidden)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor,
                on_kv: Callable[[Tensor, Tensor], None] | None = None,
                rows: PackedRows | None = None) -> Tensor:
        """x (B, T, D), or the packed real rows (N, D) of a padded batch with ``rows``."""
        x = x + self.attn(self.attn_norm(x), cos, sin, on_kv, rows)
        return x + self.mlp(self.mlp_norm(x))

    def step(self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache, pos: Tensor,
             rows: Tensor | None = None) -> Tensor:
        """:meth:`forward` for one new position per row, against a :class:`KVCache`."""
        x = x + self.attn.step(self.attn_norm(x), cos, sin, cache, pos, rows)
        return x + self.mlp(self.mlp_norm(x))
