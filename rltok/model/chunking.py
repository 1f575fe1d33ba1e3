"""Index arithmetic shared by every boundary method: boundaries -> chunks and back.

Convention (spec section 1.5): ``b[t] = 1`` means byte t is the *last* byte of a chunk.

* ``up[t]   = (sum_{j<=t} b_j) - 1``: the most recent chunk that ended at or before t. Byte t
  receives that chunk's main-network output (its prediction of byte t+1 may use it).
* ``down[t] = sum_{j<t} b_j``: the chunk byte t belongs to (zeros merge into the next 1).
* ``positions[c]``: byte position of chunk c's last byte; the main network's RoPE position.

Worked example, b = [1,0,0,1,0,0,0,1,0,1]: chunks {0},{1,2,3},{4,5,6,7},{8,9}; positions
(0,3,7,9); up = [0,0,0,1,1,1,1,2,2,3]; down = [0,1,1,1,2,2,2,2,3,3].

Everything is vectorised over batch and time; chunk sequences are right-padded to the longest.
Right padding needs no mask under causal attention: real chunks never attend to later padding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Chunks:
    positions: Tensor  # (B, M) long: byte position of each chunk's last byte (padding: S-1)
    valid: Tensor  # (B, M) bool: real chunks
    up: Tensor  # (B, S) long: c_up(t)
    down: Tensor  # (B, S) long: c_down(t)
    counts: Tensor  # (B,) long: chunks per sequence
    # static shapes only: a 0-dim bool, some row had more chunks than the cap (None: no cap)
    overflow: Tensor | None = None

    @property
    def max_chunks(self) -> int:
        return self.positions.shape[1]


def chunk_indices(b: Tensor, pad_multiple: int = 1, cap: int | None = None) -> Chunks:
    """Index tensors for boundaries ``b`` (B, S), bool or {0,1}. ``b[:, 0]`` must be 1.

    Without ``cap``, one host sync reads the longest chunk count (to size the padded chunk
    tensor); with ``pad_multiple`` > 1 it is rounded up so the main network sees few distinct
    shapes. With ``cap`` the chunk tensors have exactly ``cap`` columns and nothing waits for the
    device (static shapes: the accelerator path, ``model.static_chunks``); a row with more chunks
    than ``cap`` sets ``overflow`` and its outputs are wrong, so the caller must discard the step
    (the training step does, and grows the cap: rltok/model/static.py).
    """
    b = b.bool()
    B, S = b.shape
    csum = b.long().cumsum(1)
    up = csum - 1
    down = csum - b.long()
    counts = csum[:, -1]
    overflow = None
    if cap is None:
        M = int(counts.max().item())
        if pad_multiple > 1:
            M = -(-M // pad_multiple) * pad_multiple
        M = max(M, 1)
    else:
        M = cap
        overflow = (counts > M).any()
        # an overflowing row's chunks past the cap go to the dump column; its bytes read the
        # last real column (the step is discarded, the indices must only stay in range)
        b = b & (up < M)
        up, down = up.clamp(max=M - 1), down.clamp(max=M - 1)
    slot = torch.where(b, up, torch.full_like(up, M))  # non-boundaries go to a dump column
    positions = torch.full((B, M + 1), S - 1, dtype=torch.long, device=b.device)
    positions.scatter_(1, slot, torch.arange(S, device=b.device).expand(B, S))
    positions = positions[:, :M]
    valid = torch.arange(M, device=b.device)[None, :] < counts[:, None]
    return Chunks(positions=positions, valid=valid, up=up.clamp(min=0), down=down, counts=counts,
                  overflow=overflow)


def select(h: Tensor, chunks: Chunks) -> Tensor:
    """z_c = h at chunk c's last byte; zeros on padding. (B, S, d) -> (B, M, d)."""
    idx = chunks.positions[..., None].expand(-1, -1, h.shape[-1])
    z = torch.gather(h, 1, idx)
    return z * chunks.valid[..., None].to(z.dtype)


def mean_pool(h: Tensor, chunks: Chunks, weights: Tensor | None = None) -> Tensor:
    """Weighted mean of the bytes of each chunk. (B, S, d) -> (B, M, d).

    ``weights`` (B, S) default to ones; Nawrot's straight-through pooling passes weights that are
    1 in the forward pass and carry the boundary gradient.
    """
    B, S, d = h.shape
    M = chunks.max_chunks
    w = torch.ones(B, S, dtype=h.dtype, device=h.device) if weights is None else weights.to(h.dtype)
    # bytes after a row's last boundary (its padding) belong to no chunk: without this they
    # would be clamped into the last chunk of the row with the most chunks
    w = w * (chunks.down < chunks.counts[:, None]).to(h.dtype)
    idx = chunks.down.clamp(max=M - 1)
    num = torch.zeros(B, M, d, dtype=h.dtype, device=h.device)
    num = num.scatter_add(1, idx[..., None].expand(-1, -1, d), h * w[..., None])
    den = torch.zeros(B, M, dtype=h.dtype, device=h.device).scatter_add(1, idx, w)
    return num / den.clamp(min=1e-9)[..., None] * chunks.valid[..., None].to(h.dtype)


def gather_up(zhat: Tensor, chunks: Chunks) -> Tensor:
    """Chunk outputs back to bytes: out[t] = zhat[c_up(t)]. (B, M, d) -> (B, S, d)."""
    idx = chunks.up[..., None].expand(-1, -1, zhat.shape[-1])
    return torch.gather(zhat, 1, idx)


def last_valid(valid: Tensor) -> Tensor:
    """(B,) long: each row's last valid position (0 for a row with none)."""
    S = valid.shape[1]
    pos = torch.arange(S, device=valid.device).expand_as(valid)
    return torch.where(valid.bool(), pos, torch.zeros_like(pos)).amax(1)


def forced_mask(valid: Tensor) -> Tensor:
    """(B, S) bool: the positions whose boundary is forced, position 0 and each row's own last
    valid position. Per row, not the batch's last column, so that a document's boundaries do not
    depend on the length of the others it is padded with."""
    m = torch.zeros(valid.shape, dtype=torch.bool, device=valid.device)
    m[:, 0] = True
    m.scatter_(1, last_valid(valid)[:, None], True)
    return m


def decided_mask(valid: Tensor) -> Tensor:
    """(B, S) bool: the positions where a method decides: valid and not forced."""
    return valid & ~forced_mask(valid)


def force_ends(b: Tensor, valid: Tensor | None = None) -> Tensor:
    """Force boundaries at position 0 and at each row's last valid position (the last position
    when ``valid`` is None); clear them on padding."""
    if valid is None:
        valid = torch.ones(b.shape, dtype=torch.bool, device=b.device)
    forced = forced_mask(valid)
    if b.dtype == torch.bool:
        return (b & valid) | forced
    return torch.where(forced, torch.ones_like(b), b * valid.to(b.dtype))
