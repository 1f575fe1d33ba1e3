"""The parts a stage chunks and dechunks with (cf. H-Net's ``hnet/modules/dc.py``): a *chunker*
makes each chunk's vector from its positions, a *dechunker* hands each chunk's output back to the
positions that read it. A stage owns its router, its chunker and its dechunker as siblings
(model/stage.py); :func:`make_parts` builds the two parts a router declares it works with, from the
run's chunker.* and dechunker.* options. A stage calls them, never a method's own pooling.

Each part is a parameter-free ``nn.Module`` with ``forward`` (whole sequences), ``step`` (one new
position per row, for cached decoding) and what a prefill hands decoding (``prefill_state`` /
``prefill_pending``). Chunkers: :class:`SelectLast` (the paper: the chunk's last position),
:class:`MeanPool` (Nawrot's dynamic pooling, the authors' AverageTokenDownsampler). Dechunkers:
:class:`AddLatest` (the paper: u_t = h_t + zhat of the latest chunk, or its deviation zhat - z),
:class:`EMASmooth` (H-Net: an EMA over chunks weighted by the boundary probability).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import RltokError
from ..schema import ChunkerConfig, DechunkerConfig
from .chunking import Chunks, gather_up, mean_pool, select

P_MIN = 1e-4  # H-Net's clamp of the EMA weights


# -- chunkers ------------------------------------------------------------------------------------

class SelectLast(nn.Module):
    """z_c = h at chunk c's last position."""

    def forward(self, h: Tensor, out, chunks: Chunks) -> Tensor:
        return select(h, chunks)

    def step(self, h: Tensor, b: Tensor, state: None) -> tuple[Tensor, None]:
        """The chunk vector (n, d) for rows whose chunk ends at this position (``b``), and the state."""
        return h, None

    def prefill_state(self, h: Tensor, out, lengths: Tensor) -> None:
        return None


def straight_through_pool_weights(hard: Tensor) -> Tensor:
    """Pooling weights that are exactly 1 in the forward pass and whose gradient w.r.t. hard[j] is
    1 for every later byte l > j (Nawrot's ``1 - foo`` with foo = c - down(l))."""
    down = hard.cumsum(1) - hard
    return 1.0 + (down - down.detach())


@dataclass
class PoolState:
    """Mean pooling's decoding state: sum and count of the open chunk's positions (zero after a boundary)."""

    total: Tensor  # (n, d)
    count: Tensor  # (n,)


class MeanPool(nn.Module):
    """z_c = the mean of chunk c's positions; ``straight_through``: Nawrot's pooling weights, 1 in
    the forward pass and carrying the boundary gradient."""

    def __init__(self, straight_through: bool = False):
        super().__init__()
        self.straight_through = straight_through

    def forward(self, h: Tensor, out, chunks: Chunks) -> Tensor:
        return mean_pool(h, chunks, straight_through_pool_weights(out.hard) if self.straight_through else None)

    def step(self, h: Tensor, b: Tensor, state: PoolState | None) -> tuple[Tensor, PoolState]:
        total = h.float() if state is None else state.total + h.float()
        count = torch.ones(h.shape[0], device=h.device) if state is None else state.count + 1
        pooled = (total / count[:, None]).to(h.dtype)
        keep = (~b).float()
        return pooled, PoolState(total=total * keep[:, None], count=count * keep)

    def prefill_state(self, h: Tensor, out, lengths: Tensor) -> PoolState:
        """The open chunk after each row's first ``lengths[r]`` positions: those after its last boundary."""
        B, S, _ = h.shape
        pos = torch.arange(S, device=h.device)[None, :]
        inside = pos < lengths[:, None]
        last_b = torch.where(out.b & inside, pos, torch.full_like(pos, -1)).amax(1)
        open_ = inside & (pos > last_b[:, None])
        w = open_.float()
        return PoolState(total=(h.float() * w[..., None]).sum(1), count=w.sum(1))


# -- dechunkers ----------------------------------------------------------------------------------

class AddLatest(nn.Module):
    """u_t = h_t + what chunk c_up(t) hands back: its output zhat, or with ``deviation`` its
    change zhat - z (the authors' DistributeDeviationUpsampler)."""

    def __init__(self, deviation: bool = False):
        super().__init__()
        self.deviation = deviation

    def chunk_output(self, zhat: Tensor, z: Tensor) -> Tensor:
        """What a chunk hands back, from the network's output and its input (any shape, the same)."""
        return zhat - z.to(zhat.dtype) if self.deviation else zhat

    def forward(self, h: Tensor, zhat: Tensor, out, chunks: Chunks) -> Tensor:
        return h + gather_up(zhat, chunks)

    def merge(self, pending: Tensor, zhat: Tensor, prob: Tensor | None) -> Tensor:
        """The pending value once a chunk closes (the previous one, the new chunk's output (n, d),
        its boundary probability (n,))."""
        return zhat

    def step(self, h: Tensor, pending: Tensor) -> Tensor:
        return h + pending.to(h.dtype)

    def prefill_pending(self, zhat: Tensor, out, chunks: Chunks, last: Tensor) -> Tensor:
        """The pending value after a prefill: what byte ``last[r]`` receives."""
        c = chunks.up.gather(1, last[:, None])
        return zhat.gather(1, c[..., None].expand(-1, -1, zhat.shape[-1]))[:, 0]


class EMASmooth(AddLatest):
    """H-Net's dechunking: zbar_c = P_c zhat_c + (1 - P_c) zbar_{c-1} with P_c the boundary
    probability at chunk c (clamped to [P_MIN, 1 - P_MIN]), and u_t = h_t + zbar_{c_up(t)} times a
    straight-through confidence (p_t at a boundary, 1 - p_t elsewhere; 1 in the forward pass)."""

    def __init__(self, deviation: bool = False, block: int = 64):
        super().__init__(deviation)
        self.block = block

    def _smoothed(self, zhat: Tensor, out, chunks: Chunks) -> Tensor:
        P = out.probs.gather(1, chunks.positions).clamp(P_MIN, 1 - P_MIN)
        P = torch.where(chunks.valid, P, torch.full_like(P, 0.5))  # padding chunks: any value
        return ema_scan(zhat, P, self.block)

    def forward(self, h: Tensor, zhat: Tensor, out, chunks: Chunks) -> Tensor:
        zbar = self._smoothed(zhat, out, chunks)
        conf = torch.where(out.b, out.probs, 1 - out.probs)
        ste = 1.0 + (conf - conf.detach())  # forward 1, gradient identity
        return h + (gather_up(zbar, chunks) * ste[..., None]).to(h.dtype)

    def merge(self, pending: Tensor, zhat: Tensor, prob: Tensor | None) -> Tensor:
        P = prob.clamp(P_MIN, 1 - P_MIN)[:, None].to(zhat.dtype)
        return P * zhat + (1 - P) * pending

    def prefill_pending(self, zhat: Tensor, out, chunks: Chunks, last: Tensor) -> Tensor:
        return super().prefill_pending(self._smoothed(zhat, out, chunks), out, chunks, last)


def make_parts(router: nn.Module, chunker: ChunkerConfig | None = None,
               dechunker: DechunkerConfig | None = None) -> tuple[nn.Module, "AddLatest"]:
    """The chunker and dechunker of a stage whose router is ``router``, from the chunker.* and
    dechunker.* options (None: the defaults): the pool the options name, if the router supports it
    (``router.pools``; the first is its own), its straight-through gradient (Nawrot's), and the
    router's dechunker, add (:class:`AddLatest`) or ema (:class:`EMASmooth`)."""
    chunker, dechunker = chunker or ChunkerConfig(), dechunker or DechunkerConfig()
    pool = chunker.pool or router.pools[0]
    if pool not in router.pools:
        raise RltokError(f"chunker.pool={pool!r}: method {router.name!r} pools by {' or '.join(router.pools)}")
    chunk = SelectLast() if pool == "last" else MeanPool(straight_through=router.straight_through_pool)
    deviation = dechunker.upsample == "deviation"
    dechunk = (AddLatest(deviation=deviation) if router.dechunk == "add"
               else EMASmooth(deviation=deviation, block=dechunker.scan_block))
    return chunk, dechunk


# -- H-Net's EMA as a parallel scan ----------------------------------------------------------------

def ema_loop(x: Tensor, p: Tensor) -> Tensor:
    """Reference: y_c = p_c x_c + (1 - p_c) y_{c-1}, y_{-1} = 0. x (B, M, d), p (B, M)."""
    y = torch.zeros_like(x[:, 0])
    out = []
    for c in range(x.shape[1]):
        y = p[:, c, None] * x[:, c] + (1 - p[:, c, None]) * y
        out.append(y)
    return torch.stack(out, dim=1)


def _decay_matrix(la: Tensor) -> Tensor:
    """W[..., i, j] = prod_{k=j+1..i} a_k = exp(sum_{k=j+1..i} la_k) for j <= i, else 0, from log
    decays la (..., L). Each segment sum is accumulated directly (not as a difference of two
    running sums, which cancels catastrophically in float32 once the running sum is large), and
    the entries above the diagonal are -inf before exp: no overflow, and exactly zero gradient
    from a position to earlier ones."""
    L = la.shape[-1]
    x = la[..., :, None].expand(*la.shape, L)  # x[..., k, j] = la_k
    below = torch.ones(L, L, dtype=torch.bool, device=la.device).tril(-1)
    seg = torch.where(below, x, torch.zeros_like(x)).cumsum(-2)  # seg[i, j] = sum_{j<k<=i} la_k
    causal = torch.ones(L, L, dtype=torch.bool, device=la.device).tril()
    return torch.exp(torch.where(causal, seg, torch.full_like(seg, float("-inf"))))


def ema_scan(x: Tensor, p: Tensor, block: int = 64) -> Tensor:
    """The EMA of :func:`ema_loop` as a blocked parallel scan, float32.

    Inside blocks of ``block`` chunks: y = W (p x) with W the decay matrix (a small matmul); between
    blocks: the state entering block n is the EMA over the block-end states (again a decay
    matrix, over blocks). Every exponent is a sum of log decays <= 0, so it is stable at any
    length. Cost O(M * block * d + (M / block)^2 * d).
    """
    with torch.autocast(device_type="cpu" if x.is_meta else x.device.type, enabled=False):  # meta: rltok plan
        B, M, d = x.shape
        L = max(1, min(block, M))
        nb = -(-M // L)
        pad = nb * L - M
        xf, pf = x.float(), p.float()
        if pad:
            xf = F.pad(xf, (0, 0, 0, pad))
            pf = F.pad(pf, (0, pad), value=0.5)
        la = torch.log1p(-pf).view(B, nb, L)  # log decay per chunk
        u = (pf[..., None] * xf).view(B, nb, L, d)
        local = _decay_matrix(la) @ u  # EMA inside each block, from a zero state
        end = local[:, :, -1]  # (B, nb, d): state at the end of block n, from zero
        # state at the end of block n: after_n = sum_{m<=n} (decay of blocks m+1..n) end_m
        after = _decay_matrix(la.sum(-1)) @ end
        entering = F.pad(after, (0, 0, 1, 0))[:, :-1]  # state entering block n
        y = local + torch.exp(la.cumsum(-1))[..., None] * entering[:, :, None, :]
        return y.reshape(B, nb * L, d)[:, :M]
