"""Decoding state of the U-Net (``ByteUNet.prefill`` / ``ByteUNet.step``): KV caches per stage,
the boundary method's state, the pending chunk output, the next position; and the outputs of a
prefill and of one step. No sampling here (that is ``rltok.generate``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor

from .layers import KVCache
from .router import BoundaryStep
from .stage import StageState


@dataclass
class InferenceState:
    """Everything a U-Net needs to continue a batch of sequences one byte at a time: the
    byte-level stage's state (and, inside it, every deeper level's). The tensors' first axis is
    the batch; ``ByteUNet.step`` updates the state in place."""

    stage: StageState

    @property
    def pos(self) -> Tensor:
        """(B,) long: position of the next byte to consume."""
        return self.stage.count

    @property
    def batch_size(self) -> int:
        return self.pos.shape[0]

    @property
    def chunks(self) -> Tensor:
        """(B,) byte-level chunks so far per row."""
        inner = self.stage.inner
        if isinstance(inner, StageState):
            return inner.count
        return inner.caches[0].length if inner.caches else torch.zeros_like(self.pos)

    def select(self, rows: Tensor) -> "InferenceState":
        """The state of a subset of rows (e.g. without the finished ones)."""
        return InferenceState(self.stage.select(rows))

    def cache_bytes(self) -> dict[str, int]:
        """Memory held: byte layers (bounded by the window), chunk-level layers (allocated and
        used, bounded by the chunk count)."""
        main = self.stage.chunk_caches()
        byte = self.stage.encoder + self.stage.decoder
        main_used = sum(2 * c.k[0, :, 0].numel() * c.k.element_size() * int(c.length.sum()) for c in main)
        return {"byte_layers": sum(c.nbytes() for c in byte),
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
