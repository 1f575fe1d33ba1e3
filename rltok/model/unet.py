"""The one-stage autoregressive U-Net over bytes (spec section 1).

    ids -> embed -> encoder (sliding-window byte layers) -> h
    h -> boundary method -> b;  h, b -> downsample -> z (chunks, RoPE at their byte positions)
    z -> main network (full causal attention over chunks) -> zhat
    h, zhat, b -> upsample -> u -> decoder (byte layers) -> head -> next-byte logits
    h -> early-exit head -> next-byte logits (reward baseline and auxiliary loss)

Causality: chunk c is taken at its last byte p_c and its output is first used at p_c itself,
whose output predicts byte p_c + 1, so no shift is needed (spec 1.5).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import Tensor, nn

from ..boundaries.base import BoundaryModule, BoundaryOutput
from ..schema import N_INPUT_IDS, N_OUTPUT_IDS, PAD, ModelConfig, RunConfig
from .hub_mixin import HubMixin
from ..errors import RltokError
from .chunking import Chunks, chunk_indices
from .inference import DecodeStep, InferenceState, PrefillOutput, _fit, _pad_rows, _with_end_column
from .layers import Block, KVCache, PackedRows, RMSNorm, rope_angles
from .static import ChunkCaps
from ..syncs import accelerator_path
from .stage import ChunkStage, KVRecorder, StageOutput, inner_noise, inner_noise_step, layer_hook
from ..generate import generate


@dataclass
class UNetOutput:
    logits: Tensor  # (B, S, 257): next-byte (or end-of-document) logits
    early_logits: Tensor  # (B, S, 257): early-exit head on the encoder output
    boundary: BoundaryOutput
    chunks: Chunks
    hidden: Tensor | None = None  # (B, S, d): encoder output h (incremental decoding reads it)
    zhat: Tensor | None = None  # (B, M, d): main-network output per chunk
    inner: StageOutput | None = None  # model.stages=2: the inner stage's output
    # model.stages=2, training: next-byte logits through the exit that skips the inner stage
    skip_logits: Tensor | None = None
    # static chunk shapes (training on the accelerator path): ChunkCaps.fill of this batch
    chunk_fill: Tensor | None = None


class ByteUNet(nn.Module, HubMixin):
    def __init__(self, cfg: ModelConfig, boundary: BoundaryModule, inner: ChunkStage | None = None):
        """``inner``: the second stage of a two-stage U-Net (model.stages=2), which then takes
        the main network's place."""
        super().__init__()
        self.cfg = cfg
        d, h, eps = cfg.d_model, cfg.n_heads, cfg.norm_eps
        byte_hidden = max(1, int(round(d * cfg.byte_mlp_ratio)))
        main_hidden = max(1, int(round(d * cfg.main_mlp_ratio)))
        self.embed = nn.Embedding(N_INPUT_IDS, d)
        self.encoder = nn.ModuleList(Block(d, h, byte_hidden, cfg.window, eps) for _ in range(cfg.enc_layers))
        self.boundary = boundary
        n_main = 0 if inner is not None else cfg.main_layers
        self.main = nn.ModuleList(Block(d, h, main_hidden, None, eps) for _ in range(n_main))
        self.inner = inner
        self.decoder = nn.ModuleList(Block(d, h, byte_hidden, cfg.window, eps) for _ in range(cfg.dec_layers))
        self.norm = RMSNorm(d, eps) if cfg.head_norm else nn.Identity()
        self.head = nn.Linear(d, N_OUTPUT_IDS)
        self.early_norm = RMSNorm(d, eps) if cfg.head_norm else nn.Identity()
        if not cfg.shared_head:
            self.early_head = nn.Linear(d, N_OUTPUT_IDS)
            self.early_head.load_state_dict(self.head.state_dict())  # the paper deep-copies the head
        # static chunk shapes (made here, not on first use: a compiled graph would recompile)
        rate = float(getattr(getattr(boundary, "cfg", None), "target_rate", 1.0))
        self.chunk_caps = ChunkCaps.initial(rate, cfg.chunk_cap_row, cfg.chunk_cap_total, cfg.chunk_pad_multiple)

    def static_caps(self, device: torch.device) -> ChunkCaps | None:
        """The chunk caps when this forward pass uses static shapes (training, with
        model.static_chunks "on", or "auto" on the accelerator path; rltok/model/static.py)."""
        mode = self.cfg.static_chunks
        if not self.training or mode == "off" or (mode == "auto" and not accelerator_path(device)):
            return None
        return self.chunk_caps

    @property
    def exit_head(self) -> nn.Linear:
        """The early exit's output layer: its own copy, or the final head (model.shared_head)."""
        return self.head if self.cfg.shared_head else self.early_head

    @property
    def head_dim(self) -> int:
        return self.cfg.d_model // self.cfg.n_heads

    def encode(self, ids: Tensor, on_kv: KVRecorder | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Encoder output h (B, S, d) and the byte-level RoPE tables."""
        S = ids.shape[1]
        cos, sin = rope_angles(torch.arange(S, device=ids.device), self.head_dim, self.cfg.rope_theta)
        x = self.embed(ids)
        for i, blk in enumerate(self.encoder):
            x = blk(x, cos, sin, layer_hook(on_kv, "encoder", i))
        return x, cos, sin

    def run_main(self, z: Tensor, positions: Tensor, on_kv: KVRecorder | None = None,
                 valid: Tensor | None = None, packed: int | None = None) -> Tensor:
        """The main network over chunks z (B, M, d). With ``valid`` (B, M), its position-wise
        layers run on the real chunks only (:class:`PackedRows`, ``packed`` rows when static);
        padding chunks come out as zeros (nothing reads them: causal attention, and bytes take
        their row's real chunks)."""
        cos, sin = rope_angles(positions, self.head_dim, self.cfg.rope_theta)
        if valid is None or on_kv is not None:  # the prefill records padded keys/values
            for i, blk in enumerate(self.main):
                z = blk(z, cos, sin, layer_hook(on_kv, "main", i))
            return z
        rows = PackedRows.of(valid, size=packed)
        x = rows.pack(z)
        for blk in self.main:
            x = blk(x, cos, sin, rows=rows)
        return rows.unpack(x)

    def decode(self, u: Tensor, cos: Tensor, sin: Tensor, on_kv: KVRecorder | None = None) -> Tensor:
        """Decoder layers and the final head: next-byte logits (B, S, 257)."""
        for i, blk in enumerate(self.decoder):
            u = blk(u, cos, sin, layer_hook(on_kv, "decoder", i))
        return self.head(self.norm(u))

    def forward(self, ids: Tensor, *, noise: Tensor | None = None, boundaries: Tensor | None = None,
                mode: str = "sample", valid: Tensor | None = None,
                on_kv: KVRecorder | None = None, inner_boundaries: Tensor | None = None) -> UNetOutput:
        """``boundaries`` (B, S) fixes the boundaries (teacher forcing); else the method decides,
        drawing its randomness from ``noise`` (B, S) uniforms when given. ``mode`` is ``sample``
        or ``greedy`` (threshold probabilities at 0.5). ``on_kv`` records every attention
        layer's keys/values (see :data:`KVRecorder`). Two stages: ``inner_boundaries`` (B, M)
        fixes the inner router's decisions over the outer chunks; its uniforms come from
        ``noise`` (:func:`rltok.model.stage.inner_noise`)."""
        if valid is None:
            valid = ids != PAD
        h, cos, sin = self.encode(ids, on_kv)
        if self.inner is not None and noise is None and boundaries is None and mode == "sample":
            noise = torch.rand(ids.shape, device=ids.device)  # both levels draw from it
        bo = self.boundary(h, ids, valid=valid, noise=noise, fixed=boundaries, mode=mode)
        caps = self.static_caps(ids.device) if on_kv is None else None
        row_cap, packed = caps.sizes(*ids.shape) if caps is not None else (None, None)
        chunks = chunk_indices(bo.b, self.cfg.chunk_pad_multiple, cap=row_cap)
        z = self.boundary.downsample(h, bo, chunks)
        stage = None
        if self.inner is None:
            zmain = self.run_main(z, chunks.positions, on_kv, chunks.valid, packed)
        else:
            stage = self.inner(z, chunks.positions, chunks.valid, fixed=inner_boundaries, mode=mode, on_kv=on_kv,
                               noise=inner_noise(noise, bo, chunks, mode, fixed=boundaries is not None))
            zmain = stage.zhat
        zhat = self.boundary.chunk_output(zmain, z)
        logits = self.decode(self.boundary.upsample(h, zhat, bo, chunks), cos, sin, on_kv)
        skip = None
        if stage is not None and self.training and self.inner.boundary.cfg.inner_baseline == "skip":
            # the inner router's reward baseline: the same prediction with the inner stage skipped
            # (forward only: a baseline needs no gradient, and costs a third of a trained pass)
            with torch.no_grad():
                skip_zhat = self.boundary.chunk_output(stage.skip, z)
                skip = self.decode(self.boundary.upsample(h, skip_zhat, bo, chunks), cos, sin)
        early = self.exit_head(self.early_norm(h))
        fill = caps.fill(chunks.counts, ids.shape[1]) if caps is not None else None
        return UNetOutput(logits=logits, early_logits=early, boundary=bo, chunks=chunks,
                          hidden=h, zhat=zhat, inner=stage, skip_logits=skip, chunk_fill=fill)

    # -- decoding: one byte at a time, with caches (forward above; rltok.generate samples) ------
    @torch.no_grad()
    def prefill(self, seqs: Sequence[Sequence[int]], *, noise: Tensor | None = None,
                mode: str = "sample", boundaries: Tensor | None = None, reserve: int = 16) -> PrefillOutput:
        """Run the full forward pass once over a batch of id sequences of different lengths (each
        starting with BOS) and build the inference state after their last ids.

        ``noise`` (B, >= S) are the boundary uniforms per position; ``boundaries`` (B, >= S) impose
        the decisions (teacher forcing; position 0 is forced anyway). ``reserve`` is the extra room
        of the main-network caches before they first double.
        """
        if not seqs or any(len(s) == 0 for s in seqs):
            raise RltokError("prefill needs at least one id (BOS) per sequence")
        device = next(self.parameters()).device
        lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long, device=device)
        S = int(lengths.max()) + 1  # + one padding column: the forward's forced last boundary
        ids = _pad_rows(seqs, S, PAD, device)
        kv: dict[tuple[str, int], tuple[Tensor, Tensor]] = {}

        def record(stage: str, i: int, k: Tensor, v: Tensor) -> None:
            kv[stage, i] = (k, v)

        fixed = _fit(boundaries, S)
        out = self(ids, noise=_fit(noise, S), mode=mode, valid=_with_end_column(lengths, S),
                    boundaries=None if fixed is None else fixed.bool(), on_kv=record)
        W = self.cfg.window
        bytepos = torch.arange(S, device=device).expand(len(seqs), S)
        ch = out.chunks
        n_chunks = (ch.valid & (ch.positions < lengths[:, None])).sum(1)
        state = InferenceState(
            encoder=[KVCache.from_prefill(*kv["encoder", i], bytepos, lengths, W) for i in range(len(self.encoder))],
            main=[KVCache.from_prefill(*kv["main", i], ch.positions, n_chunks, None, reserve)
                  for i in range(len(self.main))],
            decoder=[KVCache.from_prefill(*kv["decoder", i], bytepos, lengths, W) for i in range(len(self.decoder))],
            boundary=self.boundary.decode_state(out.hidden, ids, out.boundary, lengths),
            pending=self.boundary.dechunker.prefill_pending(out.zhat, out.boundary, ch, lengths - 1),
            pos=lengths.clone(),
            chunker=self.boundary.chunker.prefill_state(out.hidden, out.boundary, lengths),
            inner=None if self.inner is None else self.inner.prefill_state(out.inner, kv, ch.positions,
                                                                            n_chunks, reserve),
        )
        last = (lengths - 1)[:, None, None].expand(-1, 1, out.logits.shape[-1])
        return PrefillOutput(logits=out.logits.gather(1, last)[:, 0], state=state, forward=out, lengths=lengths)

    @torch.no_grad()
    def step(self, state: InferenceState, ids: Tensor, *, noise: Tensor | None = None,
             mode: str = "sample", fixed: Tensor | None = None) -> DecodeStep:
        """Consume one byte per row (``ids`` (B,), at positions ``state.pos``) and return the
        next-byte logits. ``noise`` (B,) are the boundary uniforms at these positions, ``fixed``
        (B,) imposes the boundary decisions. Updates ``state`` in place."""
        cfg = self.cfg
        hd = cfg.d_model // cfg.n_heads
        pos = state.pos
        cos, sin = rope_angles(pos[:, None], hd, cfg.rope_theta)
        x = self.embed(ids)[:, None]
        for blk, c in zip(self.encoder, state.encoder):
            x = blk.step(x, cos, sin, c, pos)
        h = x[:, 0]
        bs = self.boundary.step(h, ids, state.boundary, pos=pos, noise=noise, fixed=fixed, mode=mode)
        z_all, state.chunker = self.boundary.chunker.step(h, bs.b, state.chunker)
        rows = bs.b.nonzero().squeeze(1)
        if rows.numel():  # only the rows that close a chunk run the main network, for one chunk
            z = self.boundary.adjust_chunks(z_all[rows])[:, None]
            zpos = pos[rows]
            zcos, zsin = rope_angles(zpos[:, None], hd, cfg.rope_theta)
            zin = z
            if self.inner is None:
                for blk, c in zip(self.main, state.main):
                    z = blk.step(z, zcos, zsin, c, zpos, rows)
            else:
                u_in = inner_noise_step(None if noise is None else noise[rows],
                                        None if bs.prob is None else bs.prob[rows], (pos == 0)[rows], mode,
                                        fixed=fixed is not None)
                z, _ = self.inner.step(z, zpos, state.inner, rows, noise=u_in, mode=mode)
            z = self.boundary.chunk_output(z, zin)[:, 0].to(state.pending.dtype)
            prob = None if bs.prob is None else bs.prob[rows]
            merged = self.boundary.dechunker.merge(state.pending[rows], z, prob)
            state.pending = state.pending.index_copy(0, rows, merged)
        u = self.boundary.dechunker.step(h, state.pending)[:, None]
        for blk, c in zip(self.decoder, state.decoder):
            u = blk.step(u, cos, sin, c, pos)
        logits = self.head(self.norm(u))[:, 0]
        state.boundary = bs.state
        state.pos = pos + 1
        return DecodeStep(logits=logits, boundary=bs)

    def generate(self, prompts, max_new_bytes: int = 256, temperature: float = 1.0, top_p: float = 1.0,
                 boundary_mode: str = "sample", **kwargs):
        """Sample continuations of ``prompts`` with KV caches; see :func:`rltok.generate.generate`."""
        return generate(self, prompts, max_new_bytes, temperature=temperature, top_p=top_p,
                        boundary_mode=boundary_mode, **kwargs)

    def param_groups_for_flops(self) -> tuple[int, int]:
        """(parameters applied per byte, parameters applied per chunk), matmul weights only."""
        def count(mods) -> int:
            return sum(p.numel() for m in mods for n, p in m.named_parameters() if p.dim() >= 2)

        heads = [self.head, self.head] if self.cfg.shared_head else [self.head, self.early_head]  # applied twice
        per_byte = count(list(self.encoder) + list(self.decoder) + heads + [self.boundary])
        per_chunk = count(list(self.main) if self.inner is None else [self.inner])
        return per_byte, per_chunk


def unet_builder(module_cls: type[BoundaryModule]) -> Callable[[RunConfig, Path | None], nn.Module]:
    """The usual ``MethodSpec.build``: a one-stage ByteUNet around a boundary module of this class."""

    def build(cfg: RunConfig, run_dir: Path | None = None) -> nn.Module:
        if cfg.model.stages != 1:
            raise RltokError(f"model.stages={cfg.model.stages}: method {cfg.method!r} has one stage only")
        return ByteUNet(cfg.model, module_cls(cfg.model, cfg.boundary).set_parts(cfg.chunker, cfg.dechunker))

    return build
