"""The inner stage of a two-stage U-Net (``model.stages=2``): where the one-stage U-Net runs its
main network over the chunks, a two-stage one runs this, a U-Net stage over the chunks.

    z (outer chunks, B x M) -> encoder (causal attention over chunks) -> y
    y -> router (its own REINFORCE policy; r* = boundary.inner_target_rate per outer chunk) -> b2
    y, b2 -> select -> z2 (inner chunks) -> main network -> zhat2
    y + zhat2[c_up] -> decoder -> zhat (what each outer chunk hands back to its bytes)

The index arithmetic is the byte level's (``model/chunking.py``) on the chunk axis: inner chunk
k ends at outer chunk q_k and its output is first used at q_k, so, as one level down, causality
needs no shift. RoPE positions are byte positions throughout: outer chunk m sits at its last
byte p_m, inner chunk k at p_{q_k}.

``skip`` is the exit that skips the stage: y itself, before router, main network and decoder.
The outer decoder run on it gives the inner router's reward baseline, as the early exit does for
the outer router (``objectives.unet_training_loss``; the estimator for two levels is in
docs/two_stage.md).

Decoding: :meth:`ChunkStage.step` consumes one outer chunk per row for the rows whose outer chunk
closed, with its own caches (:class:`StageState`), exactly as ``ByteUNet.step`` consumes bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor, nn

from ..boundaries.base import BoundaryModule, BoundaryOutput, assign_rows, select_rows
from ..schema import ModelConfig
from .chunking import Chunks, chunk_indices
from .layers import Block, KVCache, rope_angles

# on_kv(stage, layer, k, v): receives each attention layer's rotated keys/values (B, H, T, hd);
# stage is "encoder", "main", "decoder" or, two stages, "inner.encoder", "inner.main",
# "inner.decoder". Used by the prefill of incremental decoding.
KVRecorder = Callable[[str, int, Tensor, Tensor], None]


@dataclass
class StageOutput:
    zhat: Tensor  # (B, M, d): the stage's output per outer chunk
    skip: Tensor  # (B, M, d): the encoder output y, the exit that skips the stage
    boundary: BoundaryOutput  # (B, M): the router's decisions over the outer chunks
    chunks: Chunks  # inner chunks, indexing the outer chunk axis
    inner_zhat: Tensor  # (B, M2, d): what each inner chunk hands back (decoding's pending value)


@dataclass
class StageState:
    """Decoding state of the inner stage; the first axis is the batch."""

    encoder: list[KVCache]  # growing caches over outer chunks
    main: list[KVCache]  # growing caches over inner chunks
    decoder: list[KVCache]  # growing caches over outer chunks
    boundary: Any  # the router's decoding state
    pending: Tensor  # (B, d): output of the most recent inner chunk
    count: Tensor  # (B,) long: outer chunks consumed (the router's position on its axis)
    chunker: Any = None  # the router's chunker's decoding state

    def select(self, rows: Tensor) -> "StageState":
        return StageState(encoder=[c.select(rows) for c in self.encoder], main=[c.select(rows) for c in self.main],
                          decoder=[c.select(rows) for c in self.decoder],
                          boundary=select_rows(self.boundary, rows), pending=self.pending[rows],
                          count=self.count[rows], chunker=select_rows(self.chunker, rows))


def layer_hook(on_kv: KVRecorder | None, stage: str, i: int):
    return None if on_kv is None else (lambda k, v: on_kv(stage, i, k, v))


class ChunkStage(nn.Module):
    def __init__(self, cfg: ModelConfig, router: BoundaryModule):
        super().__init__()
        self.cfg = cfg
        d, h, eps = cfg.d_model, cfg.n_heads, cfg.norm_eps
        hidden = max(1, int(round(d * cfg.main_mlp_ratio)))
        self.encoder = nn.ModuleList(Block(d, h, hidden, None, eps) for _ in range(cfg.inner_enc_layers))
        self.boundary = router
        self.main = nn.ModuleList(Block(d, h, hidden, None, eps) for _ in range(cfg.main_layers))
        self.decoder = nn.ModuleList(Block(d, h, hidden, None, eps) for _ in range(cfg.inner_dec_layers))

    def _rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        return rope_angles(positions, self.cfg.d_model // self.cfg.n_heads, self.cfg.rope_theta)

    def forward(self, z: Tensor, positions: Tensor, valid: Tensor, *, noise: Tensor | None = None,
                fixed: Tensor | None = None, mode: str = "sample",
                on_kv: KVRecorder | None = None) -> StageOutput:
        """z (B, M, d) outer chunk vectors at byte ``positions`` (B, M), ``valid`` (B, M) real
        chunks; ``noise`` (B, M) the router's uniforms, ``fixed`` (B, M) imposed decisions."""
        cos, sin = self._rope(positions)
        y = z
        for i, blk in enumerate(self.encoder):
            y = blk(y, cos, sin, layer_hook(on_kv, "inner.encoder", i))
        no_ids = torch.zeros(valid.shape, dtype=torch.long, device=z.device)  # chunks have no byte id
        bo = self.boundary(y, no_ids, valid=valid, noise=noise, fixed=fixed, mode=mode)
        ch = chunk_indices(bo.b, self.cfg.chunk_pad_multiple)
        z2 = self.boundary.downsample(y, bo, ch)
        c2, s2 = self._rope(positions.gather(1, ch.positions))
        x = z2
        for i, blk in enumerate(self.main):
            x = blk(x, c2, s2, layer_hook(on_kv, "inner.main", i))
        zhat2 = self.boundary.chunk_output(x, z2)
        u = self.boundary.upsample(y, zhat2, bo, ch)
        for i, blk in enumerate(self.decoder):
            u = blk(u, cos, sin, layer_hook(on_kv, "inner.decoder", i))
        return StageOutput(zhat=u, skip=y, boundary=bo, chunks=ch, inner_zhat=zhat2)

    def prefill_state(self, out: StageOutput, kv: dict, positions: Tensor, n_outer: Tensor,
                      reserve: int) -> StageState:
        """The decoding state after the first ``n_outer[r]`` outer chunks of row r, from a forward
        pass that recorded its keys/values in ``kv`` (keys ("inner.encoder", i), ...)."""
        ch = out.chunks
        n_inner = (ch.valid & (ch.positions < n_outer[:, None])).sum(1)
        inner_pos = positions.gather(1, ch.positions)
        no_ids = torch.zeros(out.boundary.hard.shape, dtype=torch.long, device=positions.device)
        return StageState(
            encoder=[KVCache.from_prefill(*kv["inner.encoder", i], positions, n_outer, None, reserve)
                     for i in range(len(self.encoder))],
            main=[KVCache.from_prefill(*kv["inner.main", i], inner_pos, n_inner, None, reserve)
                  for i in range(len(self.main))],
            decoder=[KVCache.from_prefill(*kv["inner.decoder", i], positions, n_outer, None, reserve)
                     for i in range(len(self.decoder))],
            boundary=self.boundary.decode_state(out.skip, no_ids, out.boundary, n_outer),
            pending=self.boundary.dechunker.prefill_pending(out.inner_zhat, out.boundary, ch, n_outer - 1),
            count=n_outer.clone(),
            chunker=self.boundary.chunker.prefill_state(out.skip, out.boundary, n_outer),
        )

    def step(self, z: Tensor, pos: Tensor, state: StageState, rows: Tensor, *, noise: Tensor | None = None,
             mode: str = "sample", fixed: Tensor | None = None) -> tuple[Tensor, Any]:
        """One new outer chunk for each of the batch ``rows`` (n,): ``z`` (n, 1, d) at byte
        positions ``pos`` (n,). Returns its output (n, 1, d) and the router's step; updates
        ``state`` in place. ``noise``/``fixed`` (n,) as for the router's ``step``."""
        cos, sin = self._rope(pos[:, None])
        y = z
        for blk, c in zip(self.encoder, state.encoder):
            y = blk.step(y, cos, sin, c, pos, rows)
        count = state.count[rows]
        bs = self.boundary.step(y[:, 0], torch.zeros_like(pos), select_rows(state.boundary, rows), pos=count,
                                noise=noise, fixed=fixed, mode=mode)
        z_all, chunker = self.boundary.chunker.step(y[:, 0], bs.b, select_rows(state.chunker, rows))
        state.chunker = assign_rows(state.chunker, rows, chunker)
        closing = bs.b.nonzero().squeeze(1)
        if closing.numel():  # rows whose inner chunk ends at this outer chunk run the main network
            z2 = self.boundary.adjust_chunks(z_all[closing])[:, None]
            p2, r2 = pos[closing], rows[closing]
            c2, s2 = self._rope(p2[:, None])
            x = z2
            for blk, c in zip(self.main, state.main):
                x = blk.step(x, c2, s2, c, p2, r2)
            x = self.boundary.chunk_output(x, z2)[:, 0].to(state.pending.dtype)
            prob = None if bs.prob is None else bs.prob[closing]
            state.pending = state.pending.index_copy(0, r2, self.boundary.dechunker.merge(state.pending[r2], x, prob))
        u = self.boundary.dechunker.step(y[:, 0], state.pending[rows])[:, None]
        for blk, c in zip(self.decoder, state.decoder):
            u = blk.step(u, cos, sin, c, pos, rows)
        state.boundary = assign_rows(state.boundary, rows, bs.state)
        state.count = state.count.index_add(0, rows, torch.ones_like(rows))
        return u, bs


def _rescaled(u: Tensor, p: Tensor) -> Tensor:
    """u / p, kept below 1: given u < p, a uniform on [0, 1) again."""
    return (u / p.float().clamp(min=1e-30)).clamp(max=1 - 2 ** -24)


def inner_noise(noise: Tensor | None, bo: BoundaryOutput, chunks: Chunks, mode: str,
                fixed: bool) -> Tensor | None:
    """The inner router's uniforms (B, M), read off the outer router's: the uniform u_p that drew
    the outer boundary at p_m, divided by that boundary's probability pi_p when it was sampled
    (given b_p = 1 drawn as u_p < pi_p, u_p / pi_p is uniform on [0, 1) and independent of
    everything else), and u_p itself where the boundary was forced or imposed. So the forward
    pass, evaluation and cached decoding all draw both levels from the one (B, S) noise they
    already share, and the inner draws are exact Bernoulli draws."""
    if noise is None or mode == "greedy":
        return None
    u = noise.gather(1, chunks.positions)
    if fixed or bo.probs is None:
        return u
    p = bo.probs.detach().gather(1, chunks.positions)
    sampled = bo.decided.gather(1, chunks.positions)
    return torch.where(sampled, _rescaled(u, p), u)


def inner_noise_step(noise: Tensor | None, prob: Tensor | None, forced: Tensor, mode: str,
                     fixed: bool) -> Tensor | None:
    """:func:`inner_noise` for one decoding step: ``noise``, ``prob``, ``forced`` (n,) at the
    byte that closed the outer chunk."""
    if noise is None or mode == "greedy":
        return None
    if fixed or prob is None:
        return noise
    return torch.where(forced, noise, _rescaled(noise, prob))


def chunk_sums(x: Tensor, chunks: Chunks) -> Tensor:
    """Per-byte values (B, S) summed over the bytes that read each chunk (``up[t] = m``): (B, M).
    A chunk's output reaches bytes p_m .. p_{m+1} - 1, so this is what a decision that changes
    chunk m's output is credited with."""
    B, M = chunks.valid.shape
    return torch.zeros(B, M, dtype=x.dtype, device=x.device).scatter_add(1, chunks.up, x)


def inner_boundary_bytes(stage: StageOutput, chunks: Chunks, S: int) -> Tensor:
    """(B, S) bool: the bytes that end an inner chunk (the last byte of its last outer chunk)."""
    b2 = stage.boundary.b & chunks.valid
    out = torch.zeros(b2.shape[0], S + 1, dtype=torch.bool, device=b2.device)
    # padding chunks sit at S - 1 too: send them to a dump column
    idx = torch.where(chunks.valid, chunks.positions, torch.full_like(chunks.positions, S))
    return out.scatter(1, idx, b2)[:, :S]
