"""One U-Net stage, recursive (cf. H-Net's ``hnet/models/hnet.py``): a stage is encoder layers, a
router, a chunker, an inner part that is either another :class:`Stage` or the
:class:`MainNetwork`, a dechunker and decoder layers. The router, chunker and dechunker are
siblings owned by the stage (model/router.py, model/dc.py)::

    x (B, L, d) at byte positions (L,) or (B, L)       level 0: the byte embeddings
    x -> encoder -> h                                   level 0: sliding-window byte layers
    h -> router -> b;  h, b -> chunker -> z (B, M, d)   chunks at their last position's byte position
    z -> inner (Stage or MainNetwork) -> zin
    zhat = what each chunk hands back (zin, or zin - z)
    h, zhat, b -> dechunker -> u -> decoder -> y        y: the stage's output per position

A :class:`~rltok.model.unet.ByteUNet` is the byte embedding, one stage and the heads; ``model.stages``
is its depth. The index arithmetic is the same at every level (``model/chunking.py``) on the
level's own axis: chunk c ends at position p_c and its output is first used at p_c itself, so
causality needs no shift. RoPE positions are byte positions at every level: a chunk sits at its
last byte.

``h`` is also the exit that skips the stage: an outer stage's decoder run on it (instead of this
stage's output) gives this stage's router its reward baseline, as the early exit does for the byte
router (``objectives``; docs/two_stage.md). ``skips`` carries those predictions up, one per level
below.

Decoding: :meth:`Stage.step` consumes one position per row (the rows ``rows`` of the state; at
level 0 every row, one byte each) with its own caches (:class:`StageState`); a chunk that closes
runs the inner part for those rows only. ``allocate_inference_cache`` is the state of an empty
prefix; :meth:`Stage.prefill_state` the state after a forward pass that recorded its keys/values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import Tensor, nn

from .chunking import Chunks, chunk_indices
from .layers import Block, KVCache, PackedRows, rope_angles
from .router import BoundaryOutput, BoundaryStep, Router, RouterState, assign_rows, select_rows

# on_kv(name, layer, k, v): receives each attention layer's rotated keys/values (B, H, T, hd);
# name is "encoder", "main" or "decoder", with "inner." once per level below the first (the
# prefill of incremental decoding reads them)
KVRecorder = Callable[[str, int, Tensor, Tensor], None]


def layer_hook(on_kv: KVRecorder | None, name: str, i: int):
    return None if on_kv is None else (lambda k, v: on_kv(name, i, k, v))


def _rope(positions: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    return rope_angles(positions, head_dim, theta)


def _gather_positions(positions: Tensor, index: Tensor) -> Tensor:
    """The byte positions (B, M) of the entries ``index`` (B, M) of an axis whose byte positions
    are ``positions``: (L,) shared by every row (the byte axis) or (B, L)."""
    return positions[index] if positions.dim() == 1 else positions.gather(1, index)


# -- the innermost part --------------------------------------------------------------------------

@dataclass
class MainState:
    """Decoding state of the main network: growing caches over its chunks, one per layer."""

    caches: list[KVCache]

    def select(self, rows: Tensor) -> "MainState":
        return MainState([c.select(rows) for c in self.caches])


class MainNetwork(nn.Module):
    """Full causal attention over the innermost chunks."""

    def __init__(self, layers: nn.ModuleList, head_dim: int, rope_theta: float):
        super().__init__()
        self.layers = layers
        self.head_dim, self.rope_theta = head_dim, rope_theta

    def forward(self, z: Tensor, positions: Tensor, *, valid: Tensor | None = None, packed: int | None = None,
                on_kv: KVRecorder | None = None, name: str = "main") -> Tensor:
        """z (B, M, d) at byte ``positions`` (B, M). With ``valid`` (B, M), the position-wise
        layers run on the real chunks only (:class:`PackedRows`, ``packed`` rows when static);
        padding chunks come out as zeros (nothing reads them: causal attention, and positions take
        their row's real chunks)."""
        cos, sin = _rope(positions, self.head_dim, self.rope_theta)
        if valid is None or on_kv is not None:  # the prefill records padded keys/values
            for i, blk in enumerate(self.layers):
                z = blk(z, cos, sin, layer_hook(on_kv, name, i))
            return z
        rows = PackedRows.of(valid, size=packed)
        x = rows.pack(z)
        for blk in self.layers:
            x = blk(x, cos, sin, rows=rows)
        return rows.unpack(x)

    def prefill_state(self, kv: dict, positions: Tensor, lengths: Tensor, reserve: int, name: str) -> MainState:
        return MainState([KVCache.from_prefill(*kv[name, i], positions, lengths, None, reserve)
                          for i in range(len(self.layers))])

    def step(self, z: Tensor, pos: Tensor, state: MainState, rows: Tensor) -> Tensor:
        """One new chunk for each of the batch ``rows`` (n,): z (n, 1, d) at byte positions ``pos``."""
        cos, sin = _rope(pos[:, None], self.head_dim, self.rope_theta)
        for blk, c in zip(self.layers, state.caches):
            z = blk.step(z, cos, sin, c, pos, rows)
        return z


# -- a stage ---------------------------------------------------------------------------------------

@dataclass
class StageOutput:
    y: Tensor  # (B, L, d): the stage's output per position (its decoder's)
    h: Tensor  # (B, L, d): its encoder output (the router reads it; the exit that skips the stage)
    boundary: BoundaryOutput  # (B, L): the router's decisions
    chunks: Chunks  # this stage's chunks, indexing its axis
    zhat: Tensor  # (B, M, d): what each chunk hands back (decoding's pending value)
    inner: "StageOutput | None" = None  # the next level's output, when the inner part is a stage
    # this stage's output with a level below skipped (that level's router's reward baseline),
    # one entry per level below (next level first); None where that router does not ask for it
    skips: list[Tensor | None] = field(default_factory=list)

    @property
    def levels(self) -> list["StageOutput"]:
        """This stage's output and every deeper one's, outer first."""
        return [self] + ([] if self.inner is None else self.inner.levels)


@dataclass
class StageState:
    """Decoding state of a stage; the first axis of every tensor is the batch."""

    encoder: list[KVCache]  # ring caches (byte level, windowed) or growing caches
    router: RouterState  # the router's decoding state (Router.step)
    chunker: RouterState  # the chunker's (model/dc.py; None for SelectLast)
    inner: "StageState | MainState"
    decoder: list[KVCache]
    pending: Tensor  # (B, d): what the most recent chunk hands back
    count: Tensor  # (B,) long: positions consumed on this stage's axis (level 0: bytes)

    def select(self, rows: Tensor) -> "StageState":
        return StageState(encoder=[c.select(rows) for c in self.encoder], router=select_rows(self.router, rows),
                          chunker=select_rows(self.chunker, rows), inner=self.inner.select(rows),
                          decoder=[c.select(rows) for c in self.decoder], pending=self.pending[rows],
                          count=self.count[rows])

    @property
    def levels(self) -> list["StageState"]:
        return [self] + (self.inner.levels if isinstance(self.inner, StageState) else [])

    def chunk_caches(self) -> list[KVCache]:
        """Every cache over chunks: the inner part's, at every level below this one."""
        if isinstance(self.inner, MainState):
            return list(self.inner.caches)
        return self.inner.encoder + self.inner.decoder + self.inner.chunk_caches()


class Stage(nn.Module):
    def __init__(self, level: int, encoder: nn.ModuleList, router: Router, chunker: nn.Module,
                 dechunker: nn.Module, inner: "Stage | MainNetwork", decoder: nn.ModuleList,
                 head_dim: int, rope_theta: float, window: int | None, chunk_pad_multiple: int):
        super().__init__()
        # registration order (encoder, router, inner, decoder) is the parameters' order, which
        # optimizer states and the initialisation from a seed follow
        self.encoder = encoder
        self.router = router
        self.chunker, self.dechunker = chunker, dechunker  # parameter-free
        self.inner = inner
        self.decoder = decoder
        self.level = level
        self.name = "inner." * level  # the prefix of its keys/values' names (KVRecorder)
        self.head_dim, self.rope_theta = head_dim, rope_theta
        self.window, self.chunk_pad_multiple = window, chunk_pad_multiple

    @property
    def depth(self) -> int:
        return 1 + (self.inner.depth if isinstance(self.inner, Stage) else 0)

    @property
    def stages(self) -> list["Stage"]:
        """This stage and every deeper one, outer first."""
        return [self] + (self.inner.stages if isinstance(self.inner, Stage) else [])

    @property
    def main(self) -> MainNetwork:
        return self.inner.main if isinstance(self.inner, Stage) else self.inner

    def _wants_skip(self) -> bool:
        """Whether this stage's router takes the skip exit's prediction as its reward baseline."""
        return getattr(self.router.cfg, "inner_baseline", "skip") == "skip"

    def forward(self, x: Tensor, positions: Tensor, valid: Tensor, *, ids: Tensor | None = None,
                noise: Tensor | None = None, fixed: Sequence[Tensor | None] = (), mode: str = "sample",
                on_kv: KVRecorder | None = None, row_cap: int | None = None,
                packed: int | None = None) -> StageOutput:
        """x (B, L, d) at byte ``positions`` ((L,) or (B, L)), ``valid`` (B, L) real positions;
        ``ids`` (B, L) the input bytes (level 0; chunks have none). ``noise`` (B, L): the router's
        uniforms (the deeper routers' are read off them: :func:`inner_noise`); ``fixed``: imposed
        decisions, this level's first, then the deeper levels' (missing or None: decided).
        ``row_cap``/``packed``: static chunk shapes (rltok/model/static.py)."""
        cos, sin = _rope(positions, self.head_dim, self.rope_theta)
        h = self._encode(x, cos, sin, on_kv)
        if ids is None:
            ids = torch.zeros(valid.shape, dtype=torch.long, device=x.device)  # chunks have no byte id
        imposed = fixed[0] if fixed else None
        bo = self.router(h, ids, valid=valid, noise=noise, fixed=imposed, mode=mode)
        ch = chunk_indices(bo.b, self.chunk_pad_multiple, cap=row_cap)
        z = self.router.adjust_chunks(self.chunker(h, bo, ch))
        zpos = _gather_positions(positions, ch.positions)
        inner = None
        if isinstance(self.inner, Stage):
            inner = self.inner(z, zpos, ch.valid, noise=inner_noise(noise, bo, ch, mode, fixed=imposed is not None),
                               fixed=fixed[1:], mode=mode, on_kv=on_kv)
            zin = inner.y
        else:
            zin = self.inner(z, zpos, valid=ch.valid, packed=packed, on_kv=on_kv,
                             name=self.name + "main")
        zhat = self.dechunker.chunk_output(zin, z)
        y = self._decode(self.dechunker(h, zhat, bo, ch), cos, sin, on_kv)
        skips: list[Tensor | None] = []
        if inner is not None and self.training:
            # the reward baselines of the routers below: this stage's output with a level
            # skipped (forward only: a baseline needs no gradient)
            with torch.no_grad():
                below = [inner.h if self.inner._wants_skip() else None] + inner.skips
                skips = [None if s is None else self._decode(self.dechunker(h, self.dechunker.chunk_output(s, z), bo, ch),
                                                             cos, sin) for s in below]
        return StageOutput(y=y, h=h, boundary=bo, chunks=ch, zhat=zhat, inner=inner, skips=skips)

    def encode(self, x: Tensor, positions: Tensor) -> Tensor:
        """The encoder's output h (what the router reads) for x at byte ``positions``."""
        return self._encode(x, *_rope(positions, self.head_dim, self.rope_theta))

    def _encode(self, x: Tensor, cos: Tensor, sin: Tensor, on_kv: KVRecorder | None = None) -> Tensor:
        for i, blk in enumerate(self.encoder):
            x = blk(x, cos, sin, layer_hook(on_kv, self.name + "encoder", i))
        return x

    def _decode(self, u: Tensor, cos: Tensor, sin: Tensor, on_kv: KVRecorder | None = None) -> Tensor:
        for i, blk in enumerate(self.decoder):
            u = blk(u, cos, sin, layer_hook(on_kv, self.name + "decoder", i))
        return u

    # -- decoding ----------------------------------------------------------------------------------
    def prefill_state(self, out: StageOutput, kv: dict, positions: Tensor, lengths: Tensor, *,
                      ids: Tensor | None = None, reserve: int = 16) -> StageState:
        """The decoding state after the first ``lengths[r]`` positions of row r, from a forward
        pass ``out`` that recorded its keys/values in ``kv`` (keys (name, layer)). ``positions``
        (B, L): byte positions of this stage's axis."""
        ch = out.chunks
        n_chunks = (ch.valid & (ch.positions < lengths[:, None])).sum(1)
        zpos = positions.gather(1, ch.positions)

        def caches(name: str, n: int) -> list[KVCache]:
            if self.window is not None:
                return [KVCache.from_prefill(*kv[name, i], positions, lengths, self.window) for i in range(n)]
            return [KVCache.from_prefill(*kv[name, i], positions, lengths, None, reserve) for i in range(n)]

        if ids is None:
            ids = torch.zeros(out.boundary.hard.shape, dtype=torch.long, device=positions.device)
        encoder = caches(self.name + "encoder", len(self.encoder))
        if isinstance(self.inner, Stage):
            inner = self.inner.prefill_state(out.inner, kv, zpos, n_chunks, reserve=reserve)
        else:
            inner = self.inner.prefill_state(kv, zpos, n_chunks, reserve, self.name + "main")
        return StageState(
            encoder=encoder, inner=inner, decoder=caches(self.name + "decoder", len(self.decoder)),
            router=self.router.decode_state(out.h, ids, out.boundary, lengths),
            pending=self.dechunker.prefill_pending(out.zhat, out.boundary, ch, lengths - 1),
            count=lengths.clone(),
            chunker=self.chunker.prefill_state(out.h, out.boundary, lengths),
        )

    def step(self, x: Tensor, pos: Tensor, state: StageState, rows: Tensor | None = None, *,
             ids: Tensor | None = None, noise: Tensor | None = None, fixed: Tensor | None = None,
             mode: str = "sample") -> tuple[Tensor, BoundaryStep]:
        """One new position for each of the batch ``rows`` (n,) of ``state`` (None: every row):
        ``x`` (n, 1, d) at byte positions ``pos`` (n,), ``ids`` (n,) its bytes (level 0).
        ``noise``/``fixed`` (n,) as for the router's ``step`` (imposed decisions reach this level
        only). Returns the stage's output (n, 1, d) and the router's step; updates ``state`` in
        place."""
        cos, sin = _rope(pos[:, None], self.head_dim, self.rope_theta)
        h = x
        for blk, c in zip(self.encoder, state.encoder):
            h = blk.step(h, cos, sin, c, pos, rows)
        h = h[:, 0]
        count = state.count if rows is None else state.count[rows]
        mine = (lambda s: s) if rows is None else (lambda s: select_rows(s, rows))
        bs = self.router.step(h, torch.zeros_like(pos) if ids is None else ids, mine(state.router), pos=count,
                              noise=noise, fixed=fixed, mode=mode)
        z_all, chunker = self.chunker.step(h, bs.b, mine(state.chunker))
        state.chunker = chunker if rows is None else assign_rows(state.chunker, rows, chunker)
        closing = bs.b.nonzero().squeeze(1)
        if closing.numel():  # only the rows that close a chunk run the inner part, for one chunk
            z = self.router.adjust_chunks(z_all[closing])[:, None]
            zpos, zrows = pos[closing], (closing if rows is None else rows[closing])
            if isinstance(self.inner, Stage):
                u_in = inner_noise_step(None if noise is None else noise[closing],
                                        None if bs.prob is None else bs.prob[closing], (count == 0)[closing], mode,
                                        fixed=fixed is not None)
                zin, _ = self.inner.step(z, zpos, state.inner, zrows, noise=u_in, mode=mode)
            else:
                zin = self.inner.step(z, zpos, state.inner, zrows)
            zhat = self.dechunker.chunk_output(zin, z)[:, 0].to(state.pending.dtype)
            prob = None if bs.prob is None else bs.prob[closing]
            state.pending = state.pending.index_copy(0, zrows, self.dechunker.merge(state.pending[zrows], zhat, prob))
        u = self.dechunker.step(h, state.pending if rows is None else state.pending[rows])[:, None]
        for blk, c in zip(self.decoder, state.decoder):
            u = blk.step(u, cos, sin, c, pos, rows)
        state.router = bs.state if rows is None else assign_rows(state.router, rows, bs.state)
        state.count = state.count + 1 if rows is None else state.count.index_add(0, rows, torch.ones_like(rows))
        return u, bs


# -- the deeper routers' randomness ------------------------------------------------------------------

def _rescaled(u: Tensor, p: Tensor) -> Tensor:
    """u / p, kept below 1: given u < p, a uniform on [0, 1) again."""
    return (u / p.float().clamp(min=1e-30)).clamp(max=1 - 2 ** -24)


def inner_noise(noise: Tensor | None, bo: BoundaryOutput, chunks: Chunks, mode: str,
                fixed: bool) -> Tensor | None:
    """The next level's uniforms (B, M), read off this level's: the uniform u_p that drew the
    boundary at p_m, divided by that boundary's probability pi_p when it was sampled (given
    b_p = 1 drawn as u_p < pi_p, u_p / pi_p is uniform on [0, 1) and independent of everything
    else), and u_p itself where the boundary was forced or imposed. So the forward pass,
    evaluation and cached decoding all draw every level from the one (B, S) noise they already
    share, and every level's draws are exact Bernoulli draws."""
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
    position that closed the chunk."""
    if noise is None or mode == "greedy":
        return None
    if fixed or prob is None:
        return noise
    return torch.where(forced, noise, _rescaled(noise, prob))


# -- index arithmetic across levels ------------------------------------------------------------------

def chunk_sums(x: Tensor, chunks: Chunks) -> Tensor:
    """Per-position values (B, L) summed over the positions that read each chunk (``up[t] = m``):
    (B, M). A chunk's output reaches positions p_m .. p_{m+1} - 1, so this is what a decision that
    changes chunk m's output is credited with."""
    B, M = chunks.valid.shape
    return torch.zeros(B, M, dtype=x.dtype, device=x.device).scatter_add(1, chunks.up, x)


def ends_on_axis(b: Tensor, chunks: Chunks, S: int) -> Tensor:
    """(B, S) bool: the positions of the axis that ``chunks`` index (length S) that end a chunk of
    the level below, whose decisions over ``chunks`` are ``b`` (B, M): the last position of its
    last chunk."""
    b = b & chunks.valid
    out = torch.zeros(b.shape[0], S + 1, dtype=torch.bool, device=b.device)
    # padding chunks sit at S - 1 too: send them to a dump column
    idx = torch.where(chunks.valid, chunks.positions, torch.full_like(chunks.positions, S))
    return out.scatter(1, idx, b)[:, :S]


def inner_boundary_bytes(stage: StageOutput, chunks: Chunks, S: int) -> Tensor:
    """(B, S) bool: the positions that end a chunk of ``stage``, the stage one level below the
    one whose chunks are ``chunks``."""
    return ends_on_axis(stage.boundary.b, chunks, S)


def level_boundary_bytes(out: StageOutput, S: int) -> list[Tensor]:
    """(B, S) bool per level below the first, next level first: the bytes that end a chunk of that
    level (the last byte of its last chunk one level up, and so on up to the bytes)."""
    levels = out.levels
    ends: list[Tensor] = []
    for k in range(1, len(levels)):
        b = levels[k].boundary.b
        for j in range(k - 1, -1, -1):  # carry level k's ends up, one axis at a time, to the bytes
            b = ends_on_axis(b, levels[j].chunks, S if j == 0 else levels[j - 1].chunks.valid.shape[1])
        ends.append(b)
    return ends
