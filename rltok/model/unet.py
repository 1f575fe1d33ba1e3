"""The autoregressive U-Net over bytes (spec section 1): the byte embedding, one recursive
:class:`~rltok.model.stage.Stage` (``model.stages`` levels deep) and the heads.

    ids -> embed -> stage (encoder -> router -> chunker -> inner -> dechunker -> decoder) -> head
    the stage's encoder output h -> early-exit head (reward baseline and auxiliary loss)

Causality: chunk c is taken at its last byte p_c and its output is first used at p_c itself,
whose output predicts byte p_c + 1, so no shift is needed (spec 1.5); the same holds at every level.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import Tensor, nn

from ..errors import RltokError
from ..schema import N_INPUT_IDS, N_OUTPUT_IDS, PAD, ChunkerConfig, DechunkerConfig, ModelConfig, RunConfig
from ..syncs import accelerator_path
from .chunking import Chunks
from .dc import make_parts
from .hub_mixin import HubMixin, upper
from .inference import DecodeStep, InferenceState, PrefillOutput, _fit, _pad_rows, _with_end_column
from .layers import Block, RMSNorm
from .router import BoundaryOutput, Router
from .stage import KVRecorder, MainNetwork, Stage, StageOutput
from .static import ChunkCaps


@dataclass
class UNetOutput:
    logits: Tensor  # (B, S, 257): next-byte (or end-of-document) logits
    early_logits: Tensor  # (B, S, 257): early-exit head on the byte encoder's output
    stage: StageOutput  # the byte-level stage's output (and, through .inner, every deeper level's)
    # training, two levels or more: next-byte logits with level 1, 2, ... skipped (that level's
    # router's reward baseline); None where that router does not ask for it
    skip_logits: list[Tensor | None] = field(default_factory=list)
    # static chunk shapes (training on the accelerator path): ChunkCaps.fill of this batch
    chunk_fill: Tensor | None = None

    @property
    def boundary(self) -> BoundaryOutput:
        return self.stage.boundary

    @property
    def chunks(self) -> Chunks:
        return self.stage.chunks

    @property
    def hidden(self) -> Tensor:
        """(B, S, d): the byte encoder's output h."""
        return self.stage.h

    @property
    def zhat(self) -> Tensor:
        """(B, M, d): what each byte-level chunk hands back to its bytes."""
        return self.stage.zhat

    @property
    def levels(self) -> list[StageOutput]:
        """Every level's output, the byte level first."""
        return self.stage.levels


RouterFactory = Callable[[int], Router]


class ByteUNet(nn.Module, HubMixin):
    def __init__(self, cfg: ModelConfig, routers: Router | RouterFactory,
                 chunker: ChunkerConfig | None = None, dechunker: DechunkerConfig | None = None):
        """``routers``: the byte-level router (one stage), or ``level -> router`` for each of the
        ``cfg.stages`` levels. ``chunker``/``dechunker``: the run's chunker.* and dechunker.*
        options (every level's parts are built from them and its router's declarations)."""
        super().__init__()
        self.cfg = cfg
        if isinstance(routers, Router):
            if cfg.stages != 1:
                raise RltokError(f"model.stages={cfg.stages}: one router given for {cfg.stages} levels")
            router = routers
            routers = lambda level: router  # noqa: E731
        d = cfg.d_model
        # the deepest level is built first, and each level's router before its layers: the
        # initialisation from a seed is the one the U-Net had before stages were recursive
        self.stage = self._build_stage(0, routers, chunker, dechunker)
        self.norm = RMSNorm(d, cfg.norm_eps) if cfg.head_norm else nn.Identity()
        self.head = nn.Linear(d, N_OUTPUT_IDS)
        self.early_norm = RMSNorm(d, cfg.norm_eps) if cfg.head_norm else nn.Identity()
        if not cfg.shared_head:
            self.early_head = nn.Linear(d, N_OUTPUT_IDS)
            self.early_head.load_state_dict(self.head.state_dict())  # the paper deep-copies the head
        # static chunk shapes (made here, not on first use: a compiled graph would recompile)
        rate = float(getattr(getattr(self.boundary, "cfg", None), "target_rate", 1.0))
        self.chunk_caps = ChunkCaps.initial(rate, cfg.chunk_cap_row, cfg.chunk_cap_total, cfg.chunk_pad_multiple)
        self._register_load_state_dict_pre_hook(_rename_flat_keys)

    @staticmethod
    def rename_old_keys(state_dict: dict, prefix: str = "") -> None:
        """What ``load_state_dict`` does first to a format <= 10 checkpoint (flat names renamed to
        the recursive layout), for a reader that checks the names before loading."""
        _rename_flat_keys(state_dict, prefix)

    def _build_stage(self, level: int, routers: RouterFactory, chunker, dechunker) -> Stage:
        cfg = self.cfg
        d, h, eps = cfg.d_model, cfg.n_heads, cfg.norm_eps
        byte_hidden = max(1, int(round(d * cfg.byte_mlp_ratio)))
        main_hidden = max(1, int(round(d * cfg.main_mlp_ratio)))
        inner = self._build_stage(level + 1, routers, chunker, dechunker) if level + 1 < cfg.stages else None
        router = routers(level)
        if level == 0:
            self.embed = nn.Embedding(N_INPUT_IDS, d)
            window, hidden, n_enc, n_dec = cfg.window, byte_hidden, cfg.enc_layers, cfg.dec_layers
        else:
            window, hidden, n_enc, n_dec = None, main_hidden, cfg.inner_enc_layers, cfg.inner_dec_layers
        encoder = nn.ModuleList(Block(d, h, hidden, window, eps) for _ in range(n_enc))
        if inner is None:
            inner = MainNetwork(nn.ModuleList(Block(d, h, main_hidden, None, eps) for _ in range(cfg.main_layers)),
                                self.head_dim, cfg.rope_theta)
        decoder = nn.ModuleList(Block(d, h, hidden, window, eps) for _ in range(n_dec))
        return Stage(level, encoder, router, *make_parts(router, chunker, dechunker), inner, decoder,
                     self.head_dim, cfg.rope_theta, window, cfg.chunk_pad_multiple)

    @property
    def boundary(self) -> Router:
        """The byte-level router."""
        return self.stage.router

    @property
    def routers(self) -> list[Router]:
        """Every level's router, the byte level first."""
        return [s.router for s in self.stage.stages]

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

    def encode(self, ids: Tensor) -> Tensor:
        """The byte encoder's output h (B, S, d): what the byte-level router reads."""
        return self.stage.encode(self.embed(ids), torch.arange(ids.shape[1], device=ids.device))

    def forward(self, ids: Tensor, *, noise: Tensor | None = None, boundaries: Tensor | None = None,
                mode: str = "sample", valid: Tensor | None = None, on_kv: KVRecorder | None = None,
                inner_boundaries: Tensor | Sequence[Tensor | None] | None = None) -> UNetOutput:
        """``boundaries`` (B, S) fixes the byte-level boundaries (teacher forcing); else the router
        decides, drawing its randomness from ``noise`` (B, S) uniforms when given. ``mode`` is
        ``sample`` or ``greedy`` (threshold probabilities at 0.5). ``on_kv`` records every
        attention layer's keys/values (see :data:`KVRecorder`). Deeper levels: ``inner_boundaries``
        fixes level 1's decisions over the byte-level chunks (B, M), or is a list, level 1 first;
        their uniforms come from ``noise`` (:func:`rltok.model.stage.inner_noise`)."""
        if valid is None:
            valid = ids != PAD
        if self.cfg.stages > 1 and noise is None and boundaries is None and mode == "sample":
            noise = torch.rand(ids.shape, device=ids.device)  # every level draws from it
        deeper = list(inner_boundaries) if isinstance(inner_boundaries, (list, tuple)) else [inner_boundaries]
        caps = self.static_caps(ids.device) if on_kv is None else None
        row_cap, packed = caps.sizes(*ids.shape) if caps is not None else (None, None)
        positions = torch.arange(ids.shape[1], device=ids.device)
        out = self.stage(self.embed(ids), positions, valid, ids=ids, noise=noise, fixed=[boundaries, *deeper],
                         mode=mode, on_kv=on_kv, row_cap=row_cap, packed=packed)
        logits = self.head(self.norm(out.y))
        with torch.no_grad():
            skips = [None if s is None else self.head(self.norm(s)) for s in out.skips]
        early = self.exit_head(self.early_norm(out.h))
        fill = caps.fill(out.chunks.counts, ids.shape[1]) if caps is not None else None
        return UNetOutput(logits=logits, early_logits=early, stage=out, skip_logits=skips, chunk_fill=fill)

    # -- decoding: one byte at a time, with caches (forward above; rltok.generate samples) ------
    @torch.no_grad()
    def prefill(self, seqs: Sequence[Sequence[int]], *, noise: Tensor | None = None,
                mode: str = "sample", boundaries: Tensor | None = None, reserve: int = 16) -> PrefillOutput:
        """Run the full forward pass once over a batch of id sequences of different lengths (each
        starting with BOS) and build the inference state after their last ids.

        ``noise`` (B, >= S) are the boundary uniforms per position; ``boundaries`` (B, >= S) impose
        the decisions (teacher forcing; position 0 is forced anyway). ``reserve`` is the extra room
        of the chunk-level caches before they first double.
        """
        if not seqs or any(len(s) == 0 for s in seqs):
            raise RltokError("prefill needs at least one id (BOS) per sequence")
        device = next(self.parameters()).device
        lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long, device=device)
        S = int(lengths.max()) + 1  # + one padding column: the forward's forced last boundary
        ids = _pad_rows(seqs, S, PAD, device)
        kv: dict[tuple[str, int], tuple[Tensor, Tensor]] = {}

        def record(name: str, i: int, k: Tensor, v: Tensor) -> None:
            kv[name, i] = (k, v)

        fixed = _fit(boundaries, S)
        out = self(ids, noise=_fit(noise, S), mode=mode, valid=_with_end_column(lengths, S),
                   boundaries=None if fixed is None else fixed.bool(), on_kv=record)
        bytepos = torch.arange(S, device=device).expand(len(seqs), S)
        state = InferenceState(self.stage.prefill_state(out.stage, kv, bytepos, lengths, ids=ids, reserve=reserve))
        last = (lengths - 1)[:, None, None].expand(-1, 1, out.logits.shape[-1])
        return PrefillOutput(logits=out.logits.gather(1, last)[:, 0], state=state, forward=out, lengths=lengths)

    @torch.no_grad()
    def step(self, state: InferenceState, ids: Tensor, *, noise: Tensor | None = None,
             mode: str = "sample", fixed: Tensor | None = None) -> DecodeStep:
        """Consume one byte per row (``ids`` (B,), at positions ``state.pos``) and return the
        next-byte logits. ``noise`` (B,) are the boundary uniforms at these positions, ``fixed``
        (B,) imposes the byte-level decisions. Updates ``state`` in place."""
        u, bs = self.stage.step(self.embed(ids)[:, None], state.pos, state.stage, ids=ids, noise=noise,
                                fixed=fixed, mode=mode)
        return DecodeStep(logits=self.head(self.norm(u))[:, 0], boundary=bs)

    def generate(self, prompts, max_new_bytes: int = 256, temperature: float = 1.0, top_p: float = 1.0,
                 boundary_mode: str = "sample", **kwargs):
        """Sample continuations of ``prompts`` with KV caches; see :func:`rltok.generate.generate`."""
        return upper("generate").generate(self, prompts, max_new_bytes, temperature=temperature, top_p=top_p,
                                          boundary_mode=boundary_mode, **kwargs)

    def param_groups_for_flops(self) -> tuple[int, int]:
        """(parameters applied per byte, parameters applied per byte-level chunk), matmul weights only."""
        def count(mods) -> int:
            return sum(p.numel() for m in mods for n, p in m.named_parameters() if p.dim() >= 2)

        heads = [self.head, self.head] if self.cfg.shared_head else [self.head, self.early_head]  # applied twice
        per_byte = count(list(self.stage.encoder) + list(self.stage.decoder) + heads + [self.stage.router])
        return per_byte, count([self.stage.inner])


def _rename_flat_keys(state_dict: dict, prefix: str, *args) -> None:
    """Checkpoints written before stages were recursive (format <= 10) name the byte level's parts
    at the top (``encoder.0...``, ``boundary.proj...``, ``main.0...``, ``inner.encoder.0...``);
    rename them in place to the recursive layout (``stage.encoder.0...``, ``stage.router.proj...``,
    ``stage.inner.layers.0...``, ``stage.inner.encoder.0...``). The parameters' order is unchanged."""
    for key in [k for k in state_dict if k.startswith(prefix)]:
        rest = key[len(prefix):]
        level = 0
        while rest.startswith("inner."):
            level, rest = level + 1, rest[len("inner."):]
        part, _, tail = rest.partition(".")
        if part not in ("encoder", "boundary", "main", "decoder") or (level == 0 and not tail):
            continue
        path = "stage" + ".inner" * level
        new = {"encoder": f"{path}.encoder", "boundary": f"{path}.router", "decoder": f"{path}.decoder",
               "main": f"{path}.inner.layers"}[part]
        state_dict[f"{prefix}{new}.{tail}"] = state_dict.pop(key)


def unet_builder(module_cls: type[Router]) -> Callable[[RunConfig, Path | None], nn.Module]:
    """The usual ``MethodSpec.build``: a one-stage ByteUNet around a router of this class."""

    def build(cfg: RunConfig, run_dir: Path | None = None) -> nn.Module:
        if cfg.model.stages != 1:
            raise RltokError(f"model.stages={cfg.model.stages}: method {cfg.method!r} has one stage only")
        return ByteUNet(cfg.model, module_cls(cfg.model, cfg.boundary), cfg.chunker, cfg.dechunker)

    return build
