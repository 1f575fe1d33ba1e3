"""Static chunk shapes for the accelerator path: no host sync to size the chunk tensors.

How many chunks a row has is only known once the boundaries are drawn; sizing the main
network's tensors by it makes the host wait for the device (``chunk_indices`` reads the longest
row's count). With static shapes the sizes come from caps instead, as fractions of the bytes:

* ``row``: chunks per row (the main network's attention layout, ``cap_row * S`` columns);
* ``total``: chunks in the whole micro-batch (the packed rows of its position-wise layers).

Both start at ``model.chunk_cap_row`` / ``model.chunk_cap_total`` times the method's nominal rate
(its target rate; 1 for methods that keep every byte), rounded up to ``model.chunk_pad_multiple``.
A micro-batch over either cap is reported (``overflow``); the training step then skips its update
on the device, reads the flag in its one host sync and repeats the step with the caps grown to
``GROWTH`` times what was seen (rltok/train.py). Caps only grow, so a run settles within a few
steps; with the caps met the outputs equal the dynamic path's (more padding, same values).

The same idea as main-horse's capped boundaries for H-Net; the two-stage model's inner level
stays dynamic (one sync per micro-step, model.stages=2 only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

GROWTH = 1.25


def round_up(n: float, multiple: int) -> int:
    return max(multiple, int(math.ceil(n / multiple)) * multiple)


@dataclass
class ChunkCaps:
    row: float  # chunks per row / bytes per row
    total: float  # chunks per micro-batch / bytes per micro-batch
    pad_multiple: int = 8
    grown: int = 0  # times the caps grew (overflowing steps repeated)

    @classmethod
    def initial(cls, rate: float, cap_row: float, cap_total: float, pad_multiple: int) -> "ChunkCaps":
        rate = min(1.0, max(rate, 1e-3))
        return cls(row=min(1.0, cap_row * rate), total=min(1.0, cap_total * rate), pad_multiple=pad_multiple)

    def sizes(self, B: int, S: int) -> tuple[int, int]:
        """(columns per row, packed rows) for a (B, S) micro-batch."""
        row = min(round_up(self.row * S, self.pad_multiple), round_up(S, self.pad_multiple))
        total = min(round_up(self.total * B * S, 64), B * row)
        return row, total

    def fill(self, counts: Tensor, S: int) -> Tensor:
        """(3,) float on the device: [overflow, longest row / S, all chunks / (B S)] of one
        micro-batch's chunk counts (B,)."""
        B = counts.shape[0]
        row, total = self.sizes(B, S)
        c = counts.float()
        over = ((c.max() > row) | (c.sum() > total)).float()
        return torch.stack([over, c.max() / S, c.sum() / (B * S)])

    def grow(self, row_seen: float, total_seen: float) -> None:
        """After an overflow: room for GROWTH times the fractions seen."""
        self.row = min(1.0, max(self.row, GROWTH * row_seen))
        self.total = min(1.0, max(self.total, GROWTH * total_seen))
        self.grown += 1
