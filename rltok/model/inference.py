"""Decoding state of the U-Net (``ByteUNet.prefill`` / ``ByteUNet.step``): KV caches per stage,
the boundary method's state, the pending chunk output, the next position; and the outputs of a
prefill and of one step. No sampling here (that is ``rltok.generate``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor

from ..boundaries.base import BoundaryStep, select_rows
from .layers import KVCache


@dataclass
class InferenceState:
    """Everything a U-Net needs to continue a batch of sequences one byte at a time. The
    tensors' first axis is the batch; :meth:`step` updates the state in place."""

    encoder: list[KVCache]  # ring caches, one per encoder layer
    main: list[KVCache]  # growing caches over chunks, one per main layer
    decoder: list[KVCache]  # ring caches, one per decoder layer
    boundary: Any  # the boundary method's decoding state (see BoundaryModule.step)
    pending: Tensor  # (B, d): zhat of the most recent chunk
    pos: Tensor  # (B,) long: position of the next byte to consume
    inner: Any = None  # model.stages=2: the inner stage's StageState (rltok/model/stage.py)
    chunker: Any = None  # the chunker's decoding state (model/dc.py; None for SelectLast)

    @property
    def batch_size(self) -> int:
        return self.pos.shape[0]

    @property
    def chunks(self) -> Tensor:
        """(B,) chunks so far per row."""
        if self.inner is not None:
            return self.inner.count
        return self.main[0].length if self.main else torch.zeros_like(self.pos)

    def select(self, rows: Tensor) -> "InferenceState":
        """The state of a subset of rows (e.g. without the finished ones)."""
        return InferenceState(encoder=[c.select(rows) for c in self.encoder],
                              main=[c.select(rows) for c in self.main],
                              decoder=[c.select(rows) for c in self.decoder],
                              boundary=select_rows(self.boundary, rows),
                              pending=self.pending[rows], pos=self.pos[rows],
                              inner=None if self.inner is None else self.inner.select(rows),
                              chunker=select_rows(self.chunker, rows))

    def cache_bytes(self) -> dict[str, int]:
        """Memory held: byte layers (bounded by the window), main layers (allocated and used,
        bounded by the chunk count)."""
        main = list(self.main)
        if self.inner is not None:
            main += self.inner.encoder + self.inner.main + self.inner.decoder
        main_used = sum(2 * c.k[0, :, 0].numel() * c.k.element_size() * int(c.length.sum()) for c in main)
        return {"byte_layers": sum(c.nbytes() for c in self.encoder + self.decoder),
                "main_allocated": sum(c.nbytes() for c in main), "main_used": main_used}


@dataclass
class PrefillOutput:
    logits: Tensor  # (B, 257): next-byte logits after each sequence
    state: InferenceState
    forward: Any  # the UNetOutput of the prefill forward pass (B, S+1): boundaries, logits, ...
    lengths: Tensor  # (B,) sequence lengths (BOS included)


@dataclass
class DecodeStep:
    logits: Tensor  # (B, 257): next-byte logits after the consumed byte
    boundary: BoundaryStep  # the method's decision on the consumed byte


def _pad_rows(seqs: Sequence[Sequence[int]], width: int, value: int, device) -> Tensor:
    out = torch.full((len(seqs), width), value, dtype=torch.long)
    for r, s in enumerate(seqs):
        out[r, : len(s)] = torch.as_tensor(list(s), dtype=torch.long)
    return out.to(device)


def _fit(x: Tensor | None, width: int) -> Tensor | None:
    """Cut or right-pad (zeros) a (B, N) tensor to (B, width)."""
    if x is None:
        return None
    if x.shape[1] >= width:
        return x[:, :width]
    return torch.nn.functional.pad(x, (0, width - x.shape[1]))


def _with_end_column(lengths: Tensor, S: int) -> Tensor:
    """Valid positions of a prefill: each row's ids plus one padding column after them, which
    receives the forward pass's forced last boundary (forced per row at its last valid
    position), so that every real position is decided by the method."""
    return torch.arange(S, device=lengths.device)[None, :] <= lengths[:, None]
